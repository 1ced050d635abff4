"""A plain ``scrapy crawl``-style process over the shared queue, for the engine tests.

    python -m tests.support.forum_crawl REDIS_URL PREFIX SITE_URL FEED_PATH [FORUM_ID ...]

With forum ids it seeds their first list pages; without, it only consumes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

from scrapy import Request, Spider
from scrapy.crawler import CrawlerProcess
from scrapy.http import Response


class ForumCrawlSpider(Spider):
    name = "forum_e2e"

    def __init__(self, site: str = "", forums: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.site = site
        self.forums = [f for f in forums.split(",") if f]

    async def start(self) -> AsyncIterator[Request]:
        for forum in self.forums:
            yield Request(f"{self.site}/list/{forum}/1", callback=self.parse_list, priority=20)

    def parse_list(self, response: Response) -> Iterator[Request]:
        data = json.loads(response.text)
        if data["page"] == 1:
            for page in range(2, data["max_page"] + 1):
                url = f"{self.site}/list/{data['forum_id']}/{page}"
                yield Request(url, callback=self.parse_list, priority=20)
        for post in data["posts"]:
            url = f"{self.site}/post/{post['post_id']}"
            yield Request(url, callback=self.parse_post, priority=10)

    def parse_post(self, response: Response) -> Iterator[Any]:
        post = json.loads(response.text)
        yield {"kind": "post", "id": post["post_id"]}
        for page in range(1, post["comment_pages"] + 1):
            url = f"{self.site}/comment/{post['post_id']}/{page}"
            yield Request(url, callback=self.parse_comments)

    def parse_comments(self, response: Response) -> Iterator[dict[str, str]]:
        for comment in json.loads(response.text)["comments"]:
            yield {"kind": "comment", "id": comment["comment_id"]}


def main(argv: list[str]) -> None:
    redis_url, prefix, site, feed, *forums = argv
    process = CrawlerProcess(
        {
            "SCHEDULER": "celery_crawl.scheduler.Scheduler",
            "STATS_CLASS": "celery_crawl.stats.RedisStatsCollector",
            "REDIS_URL": redis_url,
            "CELERY_CRAWL_KEY_PREFIX": prefix,
            "SCHEDULER_PERSIST": True,
            "SCHEDULER_IDLE_BEFORE_CLOSE": 8,
            "HTTPERROR_ALLOWED_CODES": [],
            "RETRY_ENABLED": False,
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "INFO",
            "FEEDS": {feed: {"format": "jsonlines"}},
        }
    )
    process.crawl(ForumCrawlSpider, site=site, forums=",".join(forums))
    process.start()


if __name__ == "__main__":
    main(sys.argv[1:])
