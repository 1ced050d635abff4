"""Scrapy middlewares that carry a job through a crawl.

``JobSpiderMiddleware`` stamps the job id of a response onto every request
its callback yields, so children belong to their parent's job, and turns a
``CloseSpider`` raised by a job's callback into the end of that job.
``JobDownloaderMiddleware`` reports download errors of a job's requests, so
they show up in the job's statistics by kind, and records the time of the
last response in the shared stats (``celery_crawl/last_response_time``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, Self

from scrapy import Request
from scrapy.exceptions import CloseSpider

from celery_crawl.jobs import JOB_META, JOB_PRIORITY_META, job_close, job_error, job_items, job_of
from celery_crawl.spiders import RedisMixin

LAST_RESPONSE = "celery_crawl/last_response_time"
logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


def stamp(output: Any, response: Any) -> Any:
    """Give a child request its parent's job, and the job's priority offset."""
    job = job_of(response)
    if job and isinstance(output, Request) and JOB_META not in output.meta:
        output.meta[JOB_META] = job
        offset = int(response.meta.get(JOB_PRIORITY_META) or 0)
        if offset:
            output.meta[JOB_PRIORITY_META] = offset
            output.priority += offset
    return output


class JobSpiderMiddleware:
    """``SPIDER_MIDDLEWARES = {"celery_crawl.middleware.JobSpiderMiddleware": 1}``.

    Also counts the items of each callback, for the job's statistics.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_spider_output(self, response: Any, result: Iterable[Any]) -> Iterable[Any]:
        items = 0
        try:
            for output in result:
                items += not isinstance(output, Request)
                yield stamp(output, response)
        finally:
            self._count(response, items)

    async def process_spider_output_async(
        self, response: Any, result: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        items = 0
        try:
            async for output in result:
                items += not isinstance(output, Request)
                yield stamp(output, response)
        finally:
            self._count(response, items)

    def process_spider_exception(self, response: Any, exception: Exception) -> Any:
        """``raise CloseSpider`` in a callback of a job ends that job, not the shared crawler."""
        job = job_of(response)
        if not (job and isinstance(exception, CloseSpider)):
            return None
        reason = exception.reason or "cancelled"
        self.crawler.signals.send_catch_log(job_close, response=response, reason=reason)
        return []

    def _count(self, response: Any, items: int) -> None:
        if items and job_of(response):
            self.crawler.signals.send_catch_log(job_items, response=response, count=items)


class HostedStartMiddleware:
    """Hosted crawlers run a spider's ``start()`` only as a job: ``crawl(spider)`` with no seeds.

    A worker opens its crawlers when it starts, and Scrapy then runs each
    spider's ``start()``: without this middleware, every worker process would
    crawl ``start_urls`` before any job was asked for, outside any job. The
    exception is a :class:`~celery_crawl.spiders.RedisSpider`, whose ``start()``
    reads the start URLs pushed to Redis for as long as it runs.
    """

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        if isinstance(self.crawler.spider, RedisMixin):
            async for output in start:
                yield output
            return
        logger.info(
            "hosted spider %s: its start requests run only as a job (crawl() with no seeds)",
            getattr(self.crawler.spider, "name", "?"),
        )


class JobDownloaderMiddleware:
    """``DOWNLOADER_MIDDLEWARES = {"celery_crawl.middleware.JobDownloaderMiddleware": 950}``."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._last_response = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_response(self, request: Request, response: Any) -> Any:
        """Record when a page last arrived (at most once a second), for the exporter."""
        now = time.time()
        if self.crawler.stats is not None and now - self._last_response >= 1.0:
            self._last_response = now
            self.crawler.stats.max_value(LAST_RESPONSE, now)
        return response

    def process_exception(self, request: Request, exception: Exception) -> None:
        if job_of(request):
            self.crawler.signals.send_catch_log(
                job_error, request=request, kind=type(exception).__name__
            )
