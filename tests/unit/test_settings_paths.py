"""Every dotted path users type in settings keeps working after the move to packages.

The code lives in a package per concept; the paths below are what settings, docs and
scrapy-redis's aliases name. Each loads, and is the very object of the code's home.
"""

from __future__ import annotations

import pytest
from scrapy.utils.misc import load_object

from celery_crawl.core.compat import EQUIVALENTS
from celery_crawl.core.defaults import SETTINGS

# settings path -> where the code lives
PATHS = {
    "celery_crawl.scheduler.Scheduler": "celery_crawl.scheduler.scheduler.Scheduler",
    "celery_crawl.stats.RedisStatsCollector": "celery_crawl.stats.collector.RedisStatsCollector",
    "celery_crawl.queue.Base": "celery_crawl.queue.queues.Base",
    "celery_crawl.queue.PriorityQueue": "celery_crawl.queue.queues.PriorityQueue",
    "celery_crawl.queue.FifoQueue": "celery_crawl.queue.queues.FifoQueue",
    "celery_crawl.queue.LifoQueue": "celery_crawl.queue.queues.LifoQueue",
    "celery_crawl.queue.LifoPriorityQueue": "celery_crawl.queue.queues.LifoPriorityQueue",
    "celery_crawl.queue.Entry": "celery_crawl.queue.queues.Entry",
    "celery_crawl.dupefilter.RFPDupeFilter": "celery_crawl.dupefilter.filters.RFPDupeFilter",
    "celery_crawl.dupefilter.BloomDupeFilter": "celery_crawl.dupefilter.filters.BloomDupeFilter",
    "celery_crawl.dupefilter.ExpiringDupeFilter": (
        "celery_crawl.dupefilter.filters.ExpiringDupeFilter"
    ),
    "celery_crawl.cookies.SharedCookiesMiddleware": (
        "celery_crawl.cookies.middleware.SharedCookiesMiddleware"
    ),
    "celery_crawl.politeness.SiteLimitsMiddleware": (
        "celery_crawl.politeness.middleware.SiteLimitsMiddleware"
    ),
    "celery_crawl.pipelines.RedisPipeline": "celery_crawl.hosting.pipelines.RedisPipeline",
    "celery_crawl.spiders.RedisSpider": "celery_crawl.hosting.spiders.RedisSpider",
    "celery_crawl.spiders.RedisCrawlSpider": "celery_crawl.hosting.spiders.RedisCrawlSpider",
    "celery_crawl.spiders.RedisMixin": "celery_crawl.hosting.spiders.RedisMixin",
    "celery_crawl.middleware.JobSpiderMiddleware": (
        "celery_crawl.hosting.middleware.JobSpiderMiddleware"
    ),
    "celery_crawl.middleware.JobDownloaderMiddleware": (
        "celery_crawl.hosting.middleware.JobDownloaderMiddleware"
    ),
    "celery_crawl.middleware.JobDepthMiddleware": (
        "celery_crawl.hosting.middleware.JobDepthMiddleware"
    ),
    "celery_crawl.middleware.HostedStartMiddleware": (
        "celery_crawl.hosting.middleware.HostedStartMiddleware"
    ),
    "celery_crawl.logcontext.LogContextExtension": (
        "celery_crawl.hosting.logcontext.LogContextExtension"
    ),
    "celery_crawl.logcontext.LogContextSpiderMiddleware": (
        "celery_crawl.hosting.logcontext.LogContextSpiderMiddleware"
    ),
    "celery_crawl.logcontext.LogContextDownloaderMiddleware": (
        "celery_crawl.hosting.logcontext.LogContextDownloaderMiddleware"
    ),
    "celery_crawl.logcontext.CrawlFormatter": "celery_crawl.hosting.logcontext.CrawlFormatter",
    "celery_crawl.feeds.JobFeedExporter": "celery_crawl.hosting.feeds.JobFeedExporter",
    "celery_crawl.fingerprint.VersionedRequestFingerprinter": (
        "celery_crawl.codec.fingerprint.VersionedRequestFingerprinter"
    ),
    "celery_crawl.connection.get_redis": "celery_crawl.core.connection.get_redis",
    "celery_crawl.connection.from_settings": "celery_crawl.core.connection.from_settings",
    "celery_crawl.app.create_app": "celery_crawl.app.factory.create_app",
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_settings_path_is_the_object_of_its_home(path: str) -> None:
    assert load_object(path) is load_object(PATHS[path])


def test_every_scrapy_redis_alias_names_a_listed_path() -> None:
    ours = {value for value in EQUIVALENTS.values() if value.startswith("celery_crawl.")}
    assert len(ours) > 10
    assert ours <= set(PATHS), sorted(ours - set(PATHS))
    for alias, path in EQUIVALENTS.items():
        if path.startswith("celery_crawl."):
            assert load_object(path) is load_object(PATHS[path]), alias


def test_every_default_that_names_our_code_is_a_listed_path() -> None:
    named = set()
    for entry in SETTINGS.values():
        values = entry.default if isinstance(entry.default, tuple | dict) else (entry.default,)
        named |= {v for v in values if isinstance(v, str) and v.startswith("celery_crawl.")}
    assert named <= set(PATHS), sorted(named - set(PATHS))
