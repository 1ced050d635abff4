"""scrapy-redis's example project, rewritten for the static site, run as a ``scrapy crawl`` process.

    python -m tests.support.scrapy_redis_examples SPIDER REDIS_URL PREFIX SITE_URL

The three spiders of scrapy-redis's ``example-project`` (``dmoz.py``,
``myspider_redis.py``, ``mycrawler_redis.py``) with only their imports, class
paths and target site changed; the settings are the example's
``settings.py`` with the same changes (its ``DUPEFILTER_CLASS`` and
``SCHEDULER_QUEUE_CLASS`` stay: celery_crawl takes them as aliases).
"""

from __future__ import annotations

import sys
from typing import Any

from scrapy.crawler import CrawlerProcess
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

from celery_crawl.spiders import RedisCrawlSpider, RedisSpider  # was: scrapy_redis.spiders

PAGES = r"/page/\d+\.html$"


class DmozSpider(CrawlSpider):
    """Follow categories and extract links (dmoz.py)."""

    name = "dmoz"
    rules = (Rule(LinkExtractor(allow=PAGES), callback="parse_directory", follow=True),)

    def __init__(self, site: str = "", **kwargs: Any) -> None:
        self.start_urls = [f"{site}/"]
        super().__init__(**kwargs)

    def parse_directory(self, response: Response) -> Any:
        yield {
            "name": response.css("h1::text").get(),
            "description": response.css("p.text::text").get(),
            "link": response.url,
        }


class MySpider(RedisSpider):
    """Spider that reads urls from redis queue (myspider:start_urls) (myspider_redis.py)."""

    name = "myspider_redis"
    redis_key = "myspider:start_urls"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        domain = kwargs.pop("domain", "")
        self.allowed_domains = [d for d in domain.split(",") if d]
        super().__init__(*args, **kwargs)

    def parse(self, response: Response, **kwargs: Any) -> Any:
        return {"name": response.css("title::text").get(), "url": response.url}


class MyCrawler(RedisCrawlSpider):
    """Spider that reads urls from redis queue (mycrawler:start_urls) (mycrawler_redis.py)."""

    name = "mycrawler_redis"
    redis_key = "mycrawler:start_urls"
    rules = (Rule(LinkExtractor(allow=PAGES), callback="parse_page", follow=True),)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        domain = kwargs.pop("domain", "")
        self.allowed_domains = [d for d in domain.split(",") if d]
        super().__init__(*args, **kwargs)

    def parse_page(self, response: Response) -> Any:
        return {"name": response.css("title::text").get(), "url": response.url}


SPIDERS: dict[str, Any] = {cls.name: cls for cls in (DmozSpider, MySpider, MyCrawler)}

# the example's settings.py, with the class paths changed
SETTINGS: dict[str, Any] = {
    "USER_AGENT": "scrapy-redis (+https://github.com/rolando/scrapy-redis)",
    "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
    "SCHEDULER": "celery_crawl.scheduler.Scheduler",
    "SCHEDULER_PERSIST": True,
    "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.SpiderPriorityQueue",
    "ITEM_PIPELINES": {"celery_crawl.pipelines.RedisPipeline": 400},
    "STATS_CLASS": "celery_crawl.stats.RedisStatsCollector",
    # for the test, instead of the example's LOG_LEVEL = DEBUG and DOWNLOAD_DELAY = 1
    "LOG_LEVEL": "INFO",
    "TELNETCONSOLE_ENABLED": False,
    "RETRY_ENABLED": False,
    "SCHEDULER_IDLE_BEFORE_CLOSE": 6,  # dmoz: the second process waits for the first's links
    "MAX_IDLE_TIME_BEFORE_CLOSE": 6,  # the Redis spiders close once idle that long
}


def start_key(spider: type[RedisSpider | RedisCrawlSpider], prefix: str) -> str:
    """The test's own start key for ``spider``: the example's literal key, under the prefix."""
    return f"{prefix}:{spider.redis_key}"


def main(argv: list[str]) -> None:
    spider, redis_url, prefix, site = argv
    process = CrawlerProcess(
        {**SETTINGS, "REDIS_URL": redis_url, "CELERY_CRAWL_KEY_PREFIX": prefix}
    )
    kwargs: dict[str, str] = {"site": site} if spider == "dmoz" else {}
    if spider != "dmoz":
        kwargs.update(domain="127.0.0.1", redis_key=start_key(SPIDERS[spider], prefix))
    process.crawl(SPIDERS[spider], **kwargs)
    process.start()


if __name__ == "__main__":
    main(sys.argv[1:])
