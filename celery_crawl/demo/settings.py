"""Scrapy settings of the forum application.

The demo's app (:mod:`celery_crawl.demo.celery`) and the checkout's example app
(``tasks/``, whose settings import these) both crawl with them.

``REDIS_URL`` and the settings listed in ``CELERY_CRAWL_ENV`` are taken from
the environment when set there.
"""

BOT_NAME = "forum"
SPIDER_MODULES = ["celery_crawl.demo.spiders"]
CELERY_CRAWL_ENV = [
    "FORUM_BASE_URL",
    "FORUM_FEED",
    "PRODUCER_SOURCES",
    "PRODUCER_PERIOD",
    "CELERY_CRAWL_JOB_KEEP_SECONDS",
]
FORUM_BASE_URL = "http://127.0.0.1:8000"
FORUM_FEED = "items/%(job)s/%(name)s-%(worker)s.jsonl"  # a folder per job, a file per process

# Vertical split: `forum` scans list pages, `forum_detail` fetches posts and
# comments. One group, so one job spans both; two Celery queues, so workers
# started with `-Q forum.list` and `-Q forum.detail` scale apart, while a
# worker without `-Q` serves both.
FORUM_DETAIL_SPIDER = "forum_detail"
CELERY_CRAWL_SPIDER_GROUPS = {"forum_detail": "forum"}
CELERY_CRAWL_QUEUES = {"forum": "forum.list", "forum_detail": "forum.detail"}

# incremental crawls: a post's dedup key carries its version (see the spider)
REQUEST_FINGERPRINTER_CLASS = "celery_crawl.fingerprint.VersionedRequestFingerprinter"

CONCURRENT_REQUESTS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 32  # per process; and, shared, per site for the whole crawl
# Politeness for every worker together (docs/politeness.md): the demo site answers 429
# above 250 requests/s, so the crawl stays below it however many workers run.
SITE_RATE = 200.0
SITE_BURST = 20
DOWNLOAD_TIMEOUT = 30
RETRY_TIMES = 3
HTTPERROR_ALLOWED_CODES: list[int] = []
ROBOTSTXT_OBEY = False
LOG_LEVEL = "INFO"
FEED_URI_PARAMS = "celery_crawl.demo.feeds.uri_params"

# Celery beat runs the producer every PRODUCER_PERIOD seconds: one job per forum
# below (or per member of the Redis set the producer documents), at most
# PRODUCER_JOB_CAP jobs at once, none while the group's queues hold PRODUCER_QUEUE_CAP.
PRODUCER_SPIDERS = ["forum"]
PRODUCER_SOURCES = ["00001", "00002", "00003"]
PRODUCER_PERIOD = 60.0
PRODUCER_JOB_CAP = 10
PRODUCER_QUEUE_CAP = 50_000
