"""A ``scrapy crawl``-style process that logs in, or that only waits for work, for the cookie tests.

    python -m tests.support.members_crawl REDIS_URL PREFIX SITE_URL FEED_PATH ROLE SHARED PAGES

ROLE ``login``: the start request is the login form; its callback yields the
members-only pages 1..PAGES into the shared queue. ROLE ``wait:PATH``: no start
request; the file PATH is written once the spider is open, then the process
takes pages from the queue. SHARED ``on`` or ``off``: ``COOKIES_SHARED``.
Every member page becomes an item ``{"n", "status"}`` (403 included).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from scrapy import FormRequest, Request, Spider
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response


class MembersSpider(Spider):
    name = "members_e2e"

    def __init__(self, site: str = "", role: str = "", pages: str = "0", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.site = site
        self.role = role
        self.pages = int(pages)

    async def start(self) -> AsyncIterator[Request]:
        if self.role == "login":
            form = {"user": "crawler", "password": "secret"}
            yield FormRequest(f"{self.site}/login", formdata=form, callback=self.after_login)
        else:
            Path(self.role.removeprefix("wait:")).write_text("open")

    def after_login(self, response: Response) -> Iterator[Request]:
        for n in range(1, self.pages + 1):
            yield Request(f"{self.site}/members/{n}.html", callback=self.parse_member)

    def parse_member(self, response: Response) -> Iterator[dict[str, int]]:
        n = int(response.url.rsplit("/", 1)[1].removesuffix(".html"))
        yield {"n": n, "status": response.status}


def main(argv: list[str]) -> None:
    redis_url, prefix, site, feed, role, shared, pages = argv
    process = CrawlerProcess(
        {
            "SCHEDULER": "celery_crawl.scheduler.Scheduler",
            "STATS_CLASS": "celery_crawl.stats.RedisStatsCollector",
            "DOWNLOADER_MIDDLEWARES": {
                "scrapy.downloadermiddlewares.cookies.CookiesMiddleware": None,
                "celery_crawl.cookies.SharedCookiesMiddleware": 700,
            },
            "COOKIES_SHARED": shared == "on",
            "REDIS_URL": redis_url,
            "CELERY_CRAWL_KEY_PREFIX": prefix,
            "SCHEDULER_PERSIST": True,
            # the waiting process stays open while the other one starts and logs in
            "SCHEDULER_IDLE_BEFORE_CLOSE": 4 if role == "login" else 15,
            "SCHEDULER_PREFETCH": 2,  # small leases, so that both processes take pages
            "CONCURRENT_REQUESTS": 4,
            "HTTPERROR_ALLOWED_CODES": [403],  # a 403 becomes an item, to be counted
            "RETRY_ENABLED": False,
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "INFO",
            "FEEDS": {feed: {"format": "jsonlines"}},
        }
    )
    process.crawl(MembersSpider, site=site, role=role, pages=pages)
    process.start()


if __name__ == "__main__":
    main(sys.argv[1:])
