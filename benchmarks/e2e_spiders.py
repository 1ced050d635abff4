"""The forum spider as scrapy-redis and plain Scrapy run it, for ``benchmarks.e2e``.

    python -m benchmarks.e2e_spiders redis SITE_URL ITEMS REDIS_URL KEY_PREFIX
    python -m benchmarks.e2e_spiders plain SITE_URL ITEMS FORUM_ID...
    python -m benchmarks.e2e_spiders plain-frozen SITE_URL ITEMS FORUM_ID...
    python -m benchmarks.e2e_spiders redis-idle SITE_URL ITEMS REDIS_URL KEY_PREFIX COUNT

ITEMS is a feed path, or ``redis`` for scrapy-redis's RedisPipeline (items
pushed to a Redis list, as in scrapy-redis's example project).

They reuse ``celery_crawl.demo.spiders.ForumSpider``'s parsing, so all the
systems do the same work per page. ``redis-idle`` runs COUNT copies of the
scrapy-redis spider, under other names, in one process: the anchor of
``benchmarks.idle``. ``plain-frozen`` freezes the startup heap out of the
garbage collector once the spider is open, and raises the collector's
thresholds, as a celery_crawl worker does once its crawlers are open
(``CELERY_CRAWL_GC_FREEZE``, ``CELERY_CRAWL_GC_THRESHOLD``).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request, signals
from scrapy.crawler import CrawlerProcess
from scrapy.settings import Settings
from scrapy_redis.spiders import RedisMixin

from celery_crawl.demo.spiders import ForumSpider
from celery_crawl.hosting.host import freeze_startup_heap, gc_threshold

COMMON = {
    "CONCURRENT_REQUESTS": 32,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 32,
    "TELNETCONSOLE_ENABLED": False,
    "REMOTE_CONTROL_ENABLED": False,
    "RETRY_TIMES": 3,
    "LOG_LEVEL": "INFO",
    # %(pid)s in feed paths, as in the forum app
    "FEED_URI_PARAMS": "celery_crawl.demo.feeds.uri_params",
}


class RedisForumSpider(RedisMixin, ForumSpider):
    """Seeds are forum ids pushed to ``redis_key``; scrapy-redis's own scheduler."""

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> RedisForumSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider.setup_redis(crawler)  # as scrapy-redis's RedisSpider does
        return spider

    def make_request_from_data(self, data: bytes) -> list[Request]:
        return self.requests_from_seed({"forum_id": data.decode()})


class PlainForumSpider(ForumSpider):
    """Plain Scrapy: the forums are given up front, the scheduler is in memory."""

    def __init__(self, forums: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.forums = forums.split(",")

    async def start(self) -> AsyncIterator[Request]:
        for forum in self.forums:
            for request in self.requests_from_seed({"forum_id": forum}):
                yield request


def main(argv: list[str]) -> None:
    system, site, items, *rest = argv
    settings = {**COMMON, "FORUM_BASE_URL": site, "FORUM_FEED": None}
    if items != "redis":
        settings["FEEDS"] = {items: {"format": "jsonlines"}}
    if system in ("redis", "redis-idle"):
        redis_url, prefix, *count = rest
        if items == "redis":
            settings["ITEM_PIPELINES"] = {"scrapy_redis.pipelines.RedisPipeline": 300}
            settings["REDIS_ITEMS_KEY"] = prefix + ":%(spider)s:items"
        settings |= {
            "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
            "SCHEDULER_PERSIST": True,
            "REDIS_URL": redis_url,
            "SCHEDULER_QUEUE_KEY": prefix + ":%(spider)s:requests",
            "SCHEDULER_DUPEFILTER_KEY": prefix + ":%(spider)s:dupefilter",
            "REDIS_START_URLS_KEY": prefix + ":%(name)s:start_urls",
        }
        process = CrawlerProcess(settings)
        for spider in redis_spiders(int(count[0]) if count else 1):
            process.crawl(spider)
    else:
        process = CrawlerProcess(settings)
        crawler = process.create_crawler(PlainForumSpider)
        if system == "plain-frozen":
            crawler.signals.connect(freeze, signal=signals.spider_opened)
        process.crawl(crawler, forums=",".join(rest))
    process.start()


def redis_spiders(count: int) -> list[type[RedisForumSpider]]:
    """The forum's RedisSpider, and ``count - 1`` copies of it under other names."""
    copies = [
        type(f"Idle{n}", (RedisForumSpider,), {"name": f"idle_{n:02d}"}) for n in range(1, count)
    ]
    return [RedisForumSpider, *copies]


def freeze(spider: Any) -> None:
    """The GC tuning of a celery_crawl worker: the startup heap frozen, the thresholds raised."""
    spider.logger.info("%d startup objects frozen out of the GC", freeze_startup_heap())
    gc.set_threshold(*gc_threshold(Settings()))  # the default CELERY_CRAWL_GC_THRESHOLD


if __name__ == "__main__":
    main(sys.argv[1:])
