"""Plain ``scrapy crawl``-style processes that make one crawl together (:mod:`celery_crawl.crawl`).

    python -m tests.support.one_crawl REDIS_URL PREFIX SPIDER FEED_PATH START_URL [SETTINGS_JSON]

Every process is started the same way, start URL included, as a user starts
the same ``scrapy crawl`` twice. The spiders crawl :mod:`tests.support.static_site`:

- ``one_feed``: an ``XMLFeedSpider`` over ``/feed.xml`` that yields an item per
  entry (``{"id": ...}``) and follows its link (``{"url": ...}`` per page);
- ``one_pages``: a ``CrawlSpider`` from ``/`` that follows every page link and
  yields ``{"url": ...}`` per page.

``start`` launches one with its log in a file; ``wait_until_open`` waits
(bounded) until a number of them are open on the spider's queue.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from scrapy import Request
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor
from scrapy.selector import Selector
from scrapy.spiders import CrawlSpider, Rule, XMLFeedSpider

from celery_crawl.core.keys import SpiderKeys
from tests.support.workers import Process, start_process


class OneFeedSpider(XMLFeedSpider):
    name = "one_feed"
    itertag = "item"

    def parse_node(self, response: Response, selector: Selector) -> Iterator[Any]:
        yield {"id": selector.xpath("id/text()").get()}
        yield Request(selector.xpath("link/text()").get() or "", callback=self.parse_page)

    def parse_page(self, response: Response) -> Iterator[dict[str, str]]:
        yield {"url": response.url}


class OnePagesSpider(CrawlSpider):
    name = "one_pages"
    rules = (Rule(LinkExtractor(allow=r"/page/\d+\.html$"), callback="parse_page", follow=True),)

    def parse_page(self, response: Response) -> Iterator[dict[str, str]]:
        yield {"url": response.url}


SPIDERS = {spider.name: spider for spider in (OneFeedSpider, OnePagesSpider)}


def settings(redis_url: str, prefix: str, feed: str) -> dict[str, Any]:
    return {
        "SCHEDULER": "celery_crawl.scheduler.Scheduler",
        "STATS_CLASS": "celery_crawl.stats.RedisStatsCollector",
        "REDIS_URL": redis_url,
        "CELERY_CRAWL_KEY_PREFIX": prefix,
        "RETRY_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "FEEDS": {feed: {"format": "jsonlines"}},
    }


def main(argv: list[str]) -> None:
    redis_url, prefix, name, feed, url, *extra = argv
    process = CrawlerProcess({**settings(redis_url, prefix, feed), **json.loads(extra[0] or "{}")})
    process.crawl(SPIDERS[name], start_urls=[url])
    process.start()


def start(args: list[str], log: Path, overrides: dict[str, Any]) -> Process:
    """This module in a new process, its output in ``log``."""
    args = [*args, json.dumps(overrides)]
    return start_process("tests.support.one_crawl", args, dict(os.environ), log)


def wait_until_open(
    client: redis.Redis, keys: SpiderKeys, count: int, procs: list[Any], timeout: float = 60
) -> None:
    """Until ``count`` schedulers are open on the queue (bounded; a process that exits fails)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.zcard(keys.open_schedulers) >= count:
            return
        if any(proc.poll() is not None for proc in procs):
            raise RuntimeError("a crawl process exited before the others opened")
        time.sleep(0.1)
    raise TimeoutError(f"{count} crawl processes not open after {timeout} s")


if __name__ == "__main__":
    main(sys.argv[1:])
