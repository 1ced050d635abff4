"""Settings of a worker that hosts a project of many spiders (tests/support/many_spiders.py)."""

from tests.support.worker_settings import *  # noqa: F403

SPIDER_MODULES = ["tests.support.many_spiders"]
CELERY_CRAWL_SPIDERS: list[str] = []  # all of them
CELERY_CRAWL_SPIDER_GROUPS: dict[str, str] = {}
CELERY_CRAWL_QUEUES: dict[str, str] = {}
PRODUCER_SPIDERS: list[str] = []
# not Scrapy's defaults (10, 10000), so that a test can tell they are honoured
REACTOR_THREADPOOL_MAXSIZE = 7
DNSCACHE_SIZE = 321
