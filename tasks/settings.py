"""Scrapy settings of the forum application.

``REDIS_URL`` and the settings listed in ``CELERY_CRAWL_ENV`` are taken from
the environment when set there.
"""

BOT_NAME = "forum"
SPIDER_MODULES = ["tasks.spiders"]
CELERY_CRAWL_ENV = ["FORUM_BASE_URL", "FORUM_FEED"]
FORUM_BASE_URL = "http://127.0.0.1:8000"
FORUM_FEED = "items/%(name)s-%(pid)s.jsonl"

CONCURRENT_REQUESTS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 32
DOWNLOAD_TIMEOUT = 30
RETRY_TIMES = 3
HTTPERROR_ALLOWED_CODES: list[int] = []
ROBOTSTXT_OBEY = False
LOG_LEVEL = "INFO"
FEED_URI_PARAMS = "tasks.feeds.uri_params"
