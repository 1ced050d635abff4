"""The forum spiders: list pages, then posts, then comment pages (shared/forum-api.md).

A seed is ``{"forum_id": "00001"}``. The first list page fans out to every
list page up to ``max_page``; a post fans out to all of its comment pages.
Priorities favour list pages over posts, and posts over comments.

Vertical split: with ``FORUM_DETAIL_SPIDER = "forum_detail"`` (the app's
default) the ``forum`` spider only scans list pages and hands every post to
the ``forum_detail`` spider's queue, which fetches posts and comments. The two
form one group (``CELERY_CRAWL_SPIDER_GROUPS``), so a forum job spans both,
and they can be served by separate Celery queues (``CELERY_CRAWL_QUEUES``):
hot posts with hundreds of comment pages never hold list scanning back.
Without the setting, ``forum`` crawls everything itself.

Incremental: list pages are always fetched again (``dont_filter``). A post and
its comment pages carry a dedup version, the post's ``comment_count`` and
``last_activity`` from its listing (see ``celery_crawl.codec.fingerprint``), so a
repeated crawl fetches a post again only when its listing shows a change, and
then picks up its new comments.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from scrapy import Request, Spider
from scrapy.http import Response

from celery_crawl.codec.fingerprint import VERSION_META
from celery_crawl.scheduler.routing import to_spider

LIST_PRIORITY, POST_PRIORITY, COMMENT_PRIORITY = 20, 10, 0
MALFORMED_RETRIES = 2  # a 200 with a broken body is often transient: fetch it again

logger = logging.getLogger(__name__)


class Malformed(Exception):
    """A page that is not the JSON the forum API promises."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def forum_id_of(seed: Any) -> str:
    """The forum id of a seed, ``{"forum_id": "00001"}`` or the id itself; raises
    ``ValueError`` for anything else."""
    forum_id = seed.get("forum_id") if isinstance(seed, dict) else seed
    if not isinstance(forum_id, str) or not forum_id.isdigit():
        raise ValueError(f"a forum seed is {{'forum_id': '<digits>'}}, not {seed!r}")
    return forum_id


def set_forum_feed(settings: Any) -> None:
    """``FORUM_FEED``, when set and ``FEEDS`` is not: the items as JSON lines there."""
    feed = settings.get("FORUM_FEED")
    if feed and not settings.getdict("FEEDS"):
        settings.set("FEEDS", {feed: {"format": "jsonlines"}}, priority="spider")


class ForumSpider(Spider):
    name = "forum"
    seed_key = "forum_id"  # `celery-crawl crawl forum 00001` means {"forum_id": "00001"}

    @classmethod
    def update_settings(cls, settings: Any) -> None:
        super().update_settings(settings)
        # incremental: a post crawled by one job is not crawled again by the next one,
        # unless its version changed (celery_crawl.codec.fingerprint)
        settings.set("DUPEFILTER_SCOPE", "spider", priority="spider")
        set_forum_feed(settings)  # items: JSON lines, per job and process

    @property
    def base_url(self) -> str:
        return str(self.settings.get("FORUM_BASE_URL")).rstrip("/")

    def requests_from_seed(self, seed: Any) -> list[Request]:
        url = f"{self.base_url}/list/{forum_id_of(seed)}/1"
        return [Request(url, callback=self.parse_list, priority=LIST_PRIORITY, dont_filter=True)]

    async def start(self) -> AsyncIterator[Request]:
        """A job with no seeds (``crawl("forum")``): every forum of ``PRODUCER_SOURCES``."""
        for forum_id in self.settings.getlist("PRODUCER_SOURCES"):
            for request in self.requests_from_seed({"forum_id": forum_id}):
                yield request

    def load(self, response: Response, *fields: str) -> dict[str, Any]:
        """The page's JSON, with ``fields`` present; raises :class:`Malformed`."""
        try:
            data = json.loads(response.text)
        except ValueError as exc:
            raise Malformed("json", f"not valid JSON: {exc}") from None
        missing = [name for name in fields if not isinstance(data, dict) or name not in data]
        if missing:
            raise Malformed("missing_field", f"missing {', '.join(missing)}")
        return data  # type: ignore[no-any-return]

    def malformed(self, response: Response, error: Malformed) -> Iterator[Request]:
        """Count it by kind, log it with its URL (first and last try), fetch it again."""
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value(f"forum/malformed/{error.kind}")
        tries = int(response.meta.get("malformed_retries", 0))
        if tries in {0, MALFORMED_RETRIES}:  # once per URL, and when giving up
            logger.warning("malformed page %s (%s), try %d", response.url, error, tries + 1)
        if tries < MALFORMED_RETRIES:
            meta = {**response.meta, "malformed_retries": tries + 1}
            yield response.request.replace(dont_filter=True, meta=meta)  # type: ignore[union-attr]
        else:
            self.crawler.stats.inc_value("forum/malformed/given_up")

    def parse_list(self, response: Response) -> Iterator[Request]:
        try:
            page = self.load(response, "forum_id", "page", "max_page", "posts")
        except Malformed as error:
            yield from self.malformed(response, error)
            return
        if page["page"] == 1:
            for number in range(2, page["max_page"] + 1):
                url = f"{self.base_url}/list/{page['forum_id']}/{number}"
                yield Request(
                    url, callback=self.parse_list, priority=LIST_PRIORITY, dont_filter=True
                )
        for post in page["posts"]:
            url = f"{self.base_url}/post/{post['post_id']}"
            version = f"{post.get('comment_count')}:{post.get('last_activity')}"
            request = Request(
                url, callback=self.parse_post, priority=POST_PRIORITY, meta={VERSION_META: version}
            )
            yield to_spider(request, self.settings.get("FORUM_DETAIL_SPIDER"))

    def parse_post(self, response: Response) -> Iterator[Any]:
        try:
            post = self.load(response, *POST_FIELDS, "comment_pages")
        except Malformed as error:
            yield from self.malformed(response, error)
            return
        yield {"type": "post", **{k: post[k] for k in POST_FIELDS}}
        version = response.meta.get(VERSION_META)
        for number in range(1, post["comment_pages"] + 1):
            url = f"{self.base_url}/comment/{post['post_id']}/{number}"
            yield Request(
                url,
                callback=self.parse_comments,
                priority=COMMENT_PRIORITY,
                meta={VERSION_META: version},
            )

    def parse_comments(self, response: Response) -> Iterator[Any]:
        try:
            page = self.load(response, "post_id", "comments")
        except Malformed as error:
            yield from self.malformed(response, error)
            return
        for comment in page["comments"]:
            yield {"type": "comment", "post_id": page["post_id"], **comment}


class ForumDetailSpider(ForumSpider):
    """Posts and their comment pages, handed over by the ``forum`` spider.

    A seed of its own is ``{"post_id": "100001"}``: that post and its comments.
    """

    name = "forum_detail"
    seed_key = "post_id"

    def requests_from_seed(self, seed: Any) -> list[Request]:
        post_id = seed.get("post_id") if isinstance(seed, dict) else seed
        if not isinstance(post_id, str) or not post_id.isdigit():
            raise ValueError(f"a post seed is {{'post_id': '<digits>'}}, not {seed!r}")
        url = f"{self.base_url}/post/{post_id}"
        return [Request(url, callback=self.parse_post, priority=POST_PRIORITY)]


POST_FIELDS = ("post_id", "forum_id", "title", "content", "author", "views", "comment_count")
