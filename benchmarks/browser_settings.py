"""Settings of the browser benchmark's worker: the forum app, hosting the browser spider only."""

from tasks.settings import *  # noqa: F403

LOG_LEVEL = "INFO"
SPIDER_MODULES = ["celery_crawl.demo.browser_spiders"]
CELERY_CRAWL_SPIDERS = ["forum_js"]
CELERY_CRAWL_SPIDER_GROUPS: dict[str, str] = {}
CELERY_CRAWL_QUEUES: dict[str, str] = {}
FORUM_DETAIL_SPIDER = None
PRODUCER_SPIDERS: list[str] = []
FORUM_FEED = None  # the anchor writes no items either
# the site is unlimited, as for the anchor; the per-site limiter still runs
SITE_CONCURRENCY = 1000
SITE_RATE = 0.0
