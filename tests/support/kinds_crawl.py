"""A plain ``scrapy crawl``-style process of one spider of :mod:`tests.support.kinds_spiders`.

    python -m tests.support.kinds_crawl REDIS_URL PREFIX SPIDER FEED_PATH [START_URL ...]

With start URLs it seeds the shared queue; without, it only consumes. Its
settings are those a Scrapy project adds to use the shared scheduler, the
scrapy-redis way. ``start`` launches one with its log in a file,
and ``wait_until_open`` waits (bounded) until its spider is open;
``tests.support.feeds.read_items`` reads back the items it wrote.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from scrapy.crawler import CrawlerProcess
from scrapy.spiders import SitemapSpider

from tests.support.kinds_spiders import KINDS
from tests.support.workers import Process, start_process

IDLE_BEFORE_CLOSE = 10  # seconds: the other process may still be starting


def settings(redis_url: str, prefix: str, feed: str) -> dict[str, object]:
    return {
        "SCHEDULER": "celery_crawl.scheduler.Scheduler",
        "STATS_CLASS": "celery_crawl.stats.RedisStatsCollector",
        "REDIS_URL": redis_url,
        "CELERY_CRAWL_KEY_PREFIX": prefix,
        "SCHEDULER_PERSIST": True,  # the other process still uses the queue and the filter
        "SCHEDULER_IDLE_BEFORE_CLOSE": IDLE_BEFORE_CLOSE,
        "RETRY_ENABLED": False,  # a failed page shows as missing, not as fetched twice
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "FEEDS": {feed: {"format": "jsonlines"}},
    }


def main(argv: list[str]) -> None:
    redis_url, prefix, name, feed, *urls = argv
    spidercls = KINDS[name]
    seeds = "sitemap_urls" if issubclass(spidercls, SitemapSpider) else "start_urls"
    process = CrawlerProcess(settings(redis_url, prefix, feed))
    process.crawl(spidercls, **{seeds: urls})
    process.start()


def start(args: list[str], log: Path) -> Process:
    """This module in a new process, its output in ``log``."""
    return start_process("tests.support.kinds_crawl", args, dict(os.environ), log)


def wait_until_open(proc: Process, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "Spider opened" in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"crawl process exited:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"crawl process not open after {timeout} s:\n{log.read_text()[-3000:]}")


if __name__ == "__main__":
    main(sys.argv[1:])
