"""Feeds per job: ``FEEDS`` URIs with ``%(job)s`` get a file per job, stored when it ends.

Scrapy's ``FeedExporter`` opens its files when a crawler opens and stores
them when it closes: for a hosted crawler, when the worker stops, with every
job's items in one file. :class:`JobFeedExporter` takes its place in hosted
crawlers (``celery_crawl.project.HOSTED_MIDDLEWARES``):

- a feed whose URI has ``%(job)s`` gets one slot per job, opened at the job's
  first item in this process and stored on ``job_finished``
  (:mod:`celery_crawl.participation`), before ``Job.wait()`` returns;
- every feed may use ``%(worker)s`` (``<host>-<pid>``): a job crawled by several
  processes has one part per process, so its URI needs ``%(worker)s`` too,
  unless one process writes all of it;
- other feeds behave as in Scrapy.

Everything else is Scrapy's: formats, storages, filters, batches,
``uri_params``. It builds on ``FeedExporter``'s private slot methods
(:data:`PRIVATE`, checked against Scrapy 2.19, like :mod:`celery_crawl.engine`);
if an upgrade removes one, the crawler refuses to open, naming it.
"""

from __future__ import annotations

import itertools
import os
import socket
from typing import TYPE_CHECKING, Any, Self

from scrapy import signals
from scrapy.extensions.feedexport import FeedExporter, FeedSlot, apply_uri_params

from celery_crawl.errors import ConfigError
from celery_crawl.jobs import acks_due, job_finished, job_of

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

JOB_PLACEHOLDER = "%(job)s"
CHECKED_SCRAPY = "2.19"
# FeedExporter's private methods this module builds on
PRIVATE = ("_start_new_batch", "_get_uri_params", "_close_slot", "_schedule_slot_close")


def check_feed_exporter() -> None:
    """Refuse to start, naming what is missing, if a Scrapy upgrade removed what this builds on.

    Otherwise the first item of a job would fail in the reactor, and every one after it.
    """
    missing = [name for name in PRIVATE if not callable(getattr(FeedExporter, name, None))]
    if missing:
        raise ConfigError(
            f"this Scrapy's FeedExporter has no {', '.join(missing)}: celery_crawl's feeds per"
            f" job were checked against Scrapy {CHECKED_SCRAPY}; remove %(job)s feeds from FEEDS"
            " or use a Scrapy version that has them"
        )


def worker_name() -> str:
    """``%(worker)s``: this process, as ``<host>-<pid>``."""
    return f"{socket.gethostname()}-{os.getpid()}"


class JobFeedExporter(FeedExporter):
    """``EXTENSIONS = {"celery_crawl.feeds.JobFeedExporter": 0}`` (hosted crawlers have it)."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        exporter = cls(crawler)
        crawler.signals.connect(exporter.open_spider, signals.spider_opened)
        crawler.signals.connect(exporter.close_spider, signals.spider_closed)
        crawler.signals.connect(exporter.route_item, signals.item_scraped)
        crawler.signals.connect(exporter.close_job, job_finished)
        crawler.signals.connect(exporter.settle, acks_due)
        return exporter

    def __init__(self, crawler: Crawler) -> None:
        check_feed_exporter()
        super().__init__(crawler)
        self.job_feeds = [uri for uri in self.feeds if JOB_PLACEHOLDER in uri]
        self.job_slots: dict[str, list[FeedSlot]] = {}
        self.worker = worker_name()
        self._job = ""  # the job whose URIs are being filled in

    def open_spider(self, spider: Spider) -> None:
        """The feeds without ``%(job)s`` open now, as in Scrapy."""
        for uri, feed_options in self.feeds.items():
            if uri not in self.job_feeds:
                self.slots.append(self._new_slot(uri, feed_options, spider))

    def route_item(self, item: Any, response: Any, spider: Spider) -> None:
        """An item goes to the feeds of the spider, and to those of its job."""
        self.item_scraped(item, spider)
        job = job_of(response)
        if not (job and self.job_feeds):
            return
        shared, self._job = self.slots, job
        self.slots = self.job_slots.get(job) or self._open_job(job, spider)
        try:
            self.item_scraped(item, spider)
            self.job_slots[job] = self.slots
        finally:
            self.slots, self._job = shared, ""

    async def close_job(self, job_id: str, stats: dict[str, Any], spider: Spider) -> None:
        """On ``job_finished``: store the job's files."""
        for slot in self.job_slots.pop(job_id, []):
            await self._close_slot(slot, spider)

    async def close_spider(self, spider: Spider) -> None:
        """The worker stops: the files of jobs still open are stored as they are."""
        for slots in self.job_slots.values():
            for slot in slots:
                self._schedule_slot_close(slot, spider)
        self.job_slots.clear()
        await super().close_spider(spider)

    def settle(self) -> None:
        """``acks_due``: what the exporters wrote is handed to the OS before its pages are acked.

        Once per write of acks, not per item. A local file then holds the items
        of every acked page even if the process is killed; a temporary file of
        a remote storage does too, but nothing stores it then.
        """
        for slot in itertools.chain(self.slots, *self.job_slots.values()):
            if slot.file is not None and not slot.file.closed:
                slot.file.flush()

    def item_scraped(self, item: Any, spider: Spider) -> None:
        """Scrapy's, over ``self.slots``: the spider's feeds, or one job's."""
        if self.slots:
            super().item_scraped(item, spider)

    def _open_job(self, job: str, spider: Spider) -> list[FeedSlot]:
        return [self._new_slot(uri, self.feeds[uri], spider) for uri in self.job_feeds]

    def _new_slot(self, uri: str, feed_options: dict[str, Any], spider: Spider) -> FeedSlot:
        params = self._get_uri_params(spider, feed_options["uri_params"])
        return self._start_new_batch(
            batch_id=1,
            uri=apply_uri_params(uri, params),
            feed_options=feed_options,
            spider=spider,
            uri_template=uri,
        )

    def _get_uri_params(
        self, spider: Spider, uri_params_function: Any, slot: FeedSlot | None = None
    ) -> dict[str, Any]:
        params = super()._get_uri_params(spider, uri_params_function, slot)
        params["job"] = self._job
        params["worker"] = self.worker
        return params
