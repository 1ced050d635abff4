"""A plain ``scrapy crawl``-style process over the shared queue, on the static site.

    python -m tests.support.site_crawl REDIS_URL PREFIX SITE_URL FEED [--seed]
        [--hold FILE] [--set NAME=VALUE ...]

The spider follows every link of :mod:`tests.support.static_site` and yields an
item per page. ``--seed`` starts at ``/``; without it the process only
consumes. ``--hold FILE``: the callback of ``/`` waits (without blocking the
reactor, at most ``HOLD_LIMIT`` seconds) while FILE exists, holding its lease:
the queue is then empty while work is still coming, the moment a late process
must not mistake for the end. Scheduler settings are the defaults unless
``--set`` changes them (values are JSON, else strings).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request, Spider
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response

SPIDER = "static_site"
HOLD_LIMIT = 120.0


class SiteSpider(Spider):
    name = SPIDER

    def __init__(self, site: str = "", seed: bool = False, hold: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self.site, self.seed, self.hold = site, seed, hold

    async def start(self) -> AsyncIterator[Request]:
        if self.seed:
            yield Request(self.site + "/", callback=self.parse)

    async def parse(self, response: Response) -> AsyncIterator[Any]:
        if response.url.rstrip("/") == self.site and self.hold:
            await wait_while_exists(self.hold)
        yield {"url": response.url}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)


async def wait_while_exists(path: str) -> None:
    deadline = time.monotonic() + HOLD_LIMIT
    while os.path.exists(path) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    for name in ("redis_url", "prefix", "site", "feed"):
        parser.add_argument(name)
    parser.add_argument("--seed", action="store_true")
    parser.add_argument("--hold", default="")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    overrides = dict(pair.split("=", 1) for pair in args.set)
    process = CrawlerProcess(
        {
            "SCHEDULER": "celery_crawl.scheduler.Scheduler",
            "STATS_CLASS": "celery_crawl.stats.RedisStatsCollector",
            "REDIS_URL": args.redis_url,
            "CELERY_CRAWL_KEY_PREFIX": args.prefix,
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "INFO",
            "FEEDS": {args.feed: {"format": "jsonlines"}},
            **{name: parse_value(value) for name, value in overrides.items()},
        }
    )
    process.crawl(SiteSpider, site=args.site, seed=args.seed, hold=args.hold)
    process.start()


if __name__ == "__main__":
    main()
