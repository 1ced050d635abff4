"""A job without seeds takes the spider's start requests, gathered in the caller's process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest
from scrapy import Request, Spider
from scrapy.crawler import Crawler

from celery_crawl.core.errors import BadSeed
from celery_crawl.hosting.project import start_requests_of
from celery_crawl.hosting.spiders import RedisSpider


def spider(cls: type[Spider], **settings: Any) -> Any:
    return cls.from_crawler(Crawler(cls, {"REDIS_URL": "redis://127.0.0.1:1/0", **settings}))


class StartUrls(Spider):
    name = "start_urls"
    start_urls: ClassVar[list[str]] = ["http://127.0.0.1:1/a", "http://127.0.0.1:1/b"]


class Mixed(Spider):
    name = "mixed"

    async def start(self) -> AsyncIterator[Any]:
        yield {"an": "item"}  # skipped: items have nowhere to go before the engine runs
        yield Request("http://127.0.0.1:1/c")


class Waiting(Spider):
    name = "waiting"

    async def start(self) -> AsyncIterator[Any]:
        await asyncio.sleep(0.01)
        yield Request("http://127.0.0.1:1/never")


class Pause:
    """An awaitable that suspends, as waiting on a download or a timer would."""

    def __await__(self) -> Any:
        yield "paused"


class Suspending(Spider):
    name = "suspending"

    async def start(self) -> AsyncIterator[Any]:
        await Pause()
        yield Request("http://127.0.0.1:1/never")


class Empty(Spider):
    name = "empty"


def test_start_urls_become_the_jobs_requests() -> None:
    requests = start_requests_of(spider(StartUrls))
    assert [r.url for r in requests] == StartUrls.start_urls
    assert all(r.dont_filter for r in requests)  # Scrapy's start requests are never filtered
    assert [r.url for r in start_requests_of(spider(Mixed))] == ["http://127.0.0.1:1/c"]


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (Waiting, "start\\(\\) cannot run outside the engine .*; give the job seeds"),
        (Suspending, "start\\(\\) waits for I/O; give the job seeds"),
        (Empty, "start\\(\\) yields no request; give the job seeds"),
    ],
)
def test_a_start_that_cannot_seed_a_job_is_refused(cls: type[Spider], message: str) -> None:
    with pytest.raises(BadSeed, match=message):
        start_requests_of(spider(cls))


def test_a_redis_spider_is_fed_through_its_start_key_instead() -> None:
    class Fed(RedisSpider):
        name = "fed"

    with pytest.raises(BadSeed, match="reads its start URLs from Redis: push them to"):
        start_requests_of(spider(Fed))
