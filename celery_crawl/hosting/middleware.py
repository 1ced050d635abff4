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

from scrapy import Request, signals
from scrapy.exceptions import CloseSpider
from scrapy.spidermiddlewares.depth import DepthMiddleware

from celery_crawl.hosting.spiders import RedisMixin
from celery_crawl.jobs.limits import depth_limit
from celery_crawl.jobs.signals import (
    JOB_META,
    JOB_PRIORITY_META,
    forget_item,
    job_end_asked,
    job_error,
    job_items,
    job_of,
    set_item_job,
)

LAST_RESPONSE = "celery_crawl/last_response_time"
logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


def stamp(output: Any, response: Any) -> Any:
    """Give a child request its parent's job, and the job's priority offset; remember an item's."""
    job = job_of(response)
    if job and not isinstance(output, Request):
        set_item_job(output, job)  # celery_crawl.item_job, for pipelines
    elif job and JOB_META not in output.meta:
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
        for left in (signals.item_scraped, signals.item_dropped, signals.item_error):
            crawler.signals.connect(forget_item, signal=left)

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
        self.crawler.signals.send_catch_log(job_end_asked, response=response, reason=reason)
        return []

    def _count(self, response: Any, items: int) -> None:
        if items and job_of(response):
            self.crawler.signals.send_catch_log(job_items, response=response, count=items)


class JobDepthMiddleware(DepthMiddleware):
    """Scrapy's ``DepthMiddleware``, with each job's own depth limit.

    Hosted crawlers use it in its place. A job's limit is ``limits={"depth": N}``,
    or the spider's ``DEPTH_LIMIT`` (``celery_crawl.hosting.project.Project.job_limits``);
    requests outside any job keep ``DEPTH_LIMIT``.
    """

    def get_processed_request(self, request: Request, response: Any) -> Request | None:
        if response is None or not job_of(response):
            return super().get_processed_request(request, response)
        crawler_limit, self.maxdepth = self.maxdepth, depth_limit(response)
        try:
            return super().get_processed_request(request, response)
        finally:
            self.maxdepth = crawler_limit


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
