"""The forum spider: list pages, then posts, then comment pages (shared/forum-api.md).

A seed is ``{"forum_id": "00001"}``. The first list page fans out to every
list page up to ``max_page``; a post fans out to all of its comment pages.
Priorities favour list pages over posts, and posts over comments.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from scrapy import Request, Spider
from scrapy.http import Response

LIST_PRIORITY, POST_PRIORITY, COMMENT_PRIORITY = 20, 10, 0


class ForumSpider(Spider):
    name = "forum"
    seed_key = "forum_id"  # `celery-crawl crawl forum 00001` means {"forum_id": "00001"}

    @classmethod
    def update_settings(cls, settings: Any) -> None:
        super().update_settings(settings)
        feed = settings.get("FORUM_FEED")
        if feed and not settings.getdict("FEEDS"):  # items: one JSON-lines file per process
            settings.set("FEEDS", {feed: {"format": "jsonlines"}}, priority="spider")

    @property
    def base_url(self) -> str:
        return str(self.settings.get("FORUM_BASE_URL")).rstrip("/")

    def requests_from_seed(self, seed: Any) -> list[Request]:
        forum_id = seed.get("forum_id") if isinstance(seed, dict) else seed
        if not isinstance(forum_id, str) or not forum_id.isdigit():
            raise ValueError(f"a forum seed is {{'forum_id': '<digits>'}}, not {seed!r}")
        url = f"{self.base_url}/list/{forum_id}/1"
        return [Request(url, callback=self.parse_list, priority=LIST_PRIORITY, dont_filter=True)]

    def parse_list(self, response: Response) -> Iterator[Request]:
        page = json.loads(response.text)
        if page["page"] == 1:
            for number in range(2, page["max_page"] + 1):
                url = f"{self.base_url}/list/{page['forum_id']}/{number}"
                yield Request(url, callback=self.parse_list, priority=LIST_PRIORITY)
        for post in page["posts"]:
            url = f"{self.base_url}/post/{post['post_id']}"
            yield Request(url, callback=self.parse_post, priority=POST_PRIORITY)

    def parse_post(self, response: Response) -> Iterator[Any]:
        post = json.loads(response.text)
        yield {"type": "post", **{k: post[k] for k in POST_FIELDS}}
        for number in range(1, post["comment_pages"] + 1):
            url = f"{self.base_url}/comment/{post['post_id']}/{number}"
            yield Request(url, callback=self.parse_comments, priority=COMMENT_PRIORITY)

    def parse_comments(self, response: Response) -> Iterator[dict[str, Any]]:
        page = json.loads(response.text)
        for comment in page["comments"]:
            yield {"type": "comment", "post_id": page["post_id"], **comment}


POST_FIELDS = ("post_id", "forum_id", "title", "content", "author", "views", "comment_count")
