"""A hosted spider whose pipeline, signal handler and feed work per job.

``paths_jobs`` is the paths spider with the spider dedup scope (its jobs
share one filter) and, when ``JOB_FEED_DIR`` is set:

- ``FEEDS``: ``JOB_FEED_DIR/<job>-<worker>.jsonl``, one file per job and process;
  with ``JOB_FEED_SCHEME = "folder"``, the same files through
  :class:`FolderFeedStorage`, a remote storage (stored when the job ends, from a
  file of its own) whose remote side is a folder;
- :class:`JobHooksPipeline`, which records in ``JOB_FEED_DIR/events-<pid>.jsonl``
  each ``open_job``, ``close_job`` (with the items it saw of the job) and
  ``job_finished`` (with the job's stats), in the order they happen.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import IO, Any, Self
from urllib.parse import urlparse

from scrapy.crawler import Crawler
from scrapy.extensions.feedexport import BlockingFeedStorage
from scrapy.settings import BaseSettings

from celery_crawl import item_job, job_finished
from tests.support.paths_spider import PathsSpider


class PathsJobsSpider(PathsSpider):
    name = "paths_jobs"

    @classmethod
    def update_settings(cls, settings: BaseSettings) -> None:
        super().update_settings(settings)
        settings.set("DUPEFILTER_SCOPE", "spider", priority="spider")
        folder = settings.get("JOB_FEED_DIR")
        if not folder:
            return
        feed = f"{folder}/%(job)s-%(worker)s.jsonl"
        if settings.get("JOB_FEED_SCHEME") == "folder":
            feed = f"folder://{feed}"
            storages = {**settings.getdict("FEED_STORAGES"), "folder": FolderFeedStorage}
            settings.set("FEED_STORAGES", storages, priority="spider")
        settings.set("FEEDS", {feed: {"format": "jsonlines"}}, priority="spider")
        pipelines = {**settings.getdict("ITEM_PIPELINES"), f"{__name__}.JobHooksPipeline": 300}
        settings.set("ITEM_PIPELINES", pipelines, priority="spider")


class FolderFeedStorage(BlockingFeedStorage):
    """``folder:///path``: stored as S3, GCS and FTP are, by copying the whole file to the path."""

    def __init__(self, uri: str, *, feed_options: dict[str, Any] | None = None) -> None:
        self.path = Path(urlparse(uri).path)

    def _store_in_thread(self, file: IO[bytes]) -> None:
        file.seek(0)
        self.path.write_bytes(file.read())
        file.close()


class JobHooksPipeline:
    def __init__(self, folder: str) -> None:
        self.events = Path(folder) / f"events-{os.getpid()}.jsonl"
        self.seen: Counter[str] = Counter()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        pipeline = cls(crawler.settings["JOB_FEED_DIR"])
        crawler.signals.connect(pipeline.job_finished, signal=job_finished)
        return pipeline

    def record(self, **event: Any) -> None:
        with self.events.open("a") as out:
            out.write(json.dumps({"pid": os.getpid(), **event}) + "\n")

    def open_job(self, job_id: str) -> None:
        self.record(event="open_job", job=job_id, seen=self.seen[job_id])

    def process_item(self, item: Any) -> Any:
        self.seen[item_job(item)] += 1
        return item

    async def close_job(self, job_id: str, stats: dict[str, Any]) -> None:
        self.record(event="close_job", job=job_id, seen=self.seen.pop(job_id, 0))

    def job_finished(self, job_id: str, stats: dict[str, Any], spider: Any) -> None:
        self.record(event="job_finished", job=job_id, items=stats["items"], spider=spider.name)
