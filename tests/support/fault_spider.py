"""The tree of the paths site, with a hook that stops one process at one step of a request.

``FAULT_STEP`` names the step; the first process to reach it with the trigger
page (``FAULT_TRIGGER``, a path of the tree) creates ``FAULT_MARKER`` and stops
there, for the test to ``kill -9`` it. The process that finishes the crawl
finds the marker and passes. The steps:

- ``after_lease``: the request was leased and handed to the engine; the
  reactor stops before its download (the heartbeat thread still renews it);
- ``during_download``: the site holds the trigger page's first download
  (``PathsSite.hold_first``, set by the test; no hook here);
- ``after_parse``: the callback yielded its item and children, which wait in
  the write-behind buffer: the reactor stops before the flush;
- ``after_flush``: the children are in Redis, the parent not acked yet;
- ``pause_after_parse``: as ``after_parse``, but the process goes on once the
  test deletes ``FAULT_MARKER`` (the test stops it meanwhile, SIGSTOP, so
  that its leases lapse: a worker cut off, back late);
- ``warm_shutdown``: the worker was told to stop; a pipeline's
  ``close_spider`` stops it before the scheduler hands its leases back.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request
from scrapy.crawler import Crawler
from scrapy.http import Response
from scrapy.settings import BaseSettings

from tests.support.paths_spider import PathsSpider

STOPPED_FOR = 600.0  # seconds a stopped process waits for its kill -9


def reached(settings: Any, step: str, url: str = "") -> bool:
    """True for the first process to reach ``step`` (with the trigger page, if ``url``)."""
    if settings.get("FAULT_STEP") != step:
        return False
    if url and not url.endswith(str(settings.get("FAULT_TRIGGER"))):
        return False
    try:
        os.close(os.open(settings["FAULT_MARKER"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def stop_here() -> None:
    """Hold the process (the reactor too) until the test kills it."""
    time.sleep(STOPPED_FOR)


def hold_while(marker: str) -> None:
    """Hold the process (the reactor too) while ``marker`` exists, at most STOPPED_FOR s."""
    deadline = time.monotonic() + STOPPED_FOR
    while os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)


class FaultTreeSpider(PathsSpider):
    name = "fault_tree"

    @classmethod
    def update_settings(cls, settings: BaseSettings) -> None:
        super().update_settings(settings)
        hooks = [
            ("DOWNLOADER_MIDDLEWARES", f"{__name__}.StopAfterLease", 1),
            ("ITEM_PIPELINES", f"{__name__}.StopInWarmShutdown", 100),
        ]
        for name, path, order in hooks:
            settings.set(name, {**settings.getdict(name), path: order}, priority="spider")

    async def parse(self, response: Response) -> AsyncIterator[Any]:  # type: ignore[override]
        for output in super().parse(response):
            yield output
        if reached(self.settings, "after_parse", response.url):
            stop_here()  # the children wait in the buffer: no reactor turn flushes them
        if reached(self.settings, "pause_after_parse", response.url):
            hold_while(self.settings["FAULT_MARKER"])  # then the buffer flushes, late
        if self.settings.get("FAULT_STEP") == "after_flush" and response.url.endswith(
            str(self.settings.get("FAULT_TRIGGER"))
        ):
            await asyncio.sleep(0.5)  # the reactor runs: the buffer's 10 ms flush is done
            if reached(self.settings, "after_flush", response.url):
                stop_here()  # ... and the parent's ack is not


class StopAfterLease:
    def __init__(self, crawler: Crawler) -> None:
        self.settings = crawler.settings

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> StopAfterLease:
        return cls(crawler)

    def process_request(self, request: Request) -> None:
        if reached(self.settings, "after_lease", request.url):
            stop_here()


class StopInWarmShutdown:
    def __init__(self, crawler: Crawler) -> None:
        self.settings = crawler.settings

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> StopInWarmShutdown:
        return cls(crawler)

    def process_item(self, item: Any) -> Any:
        return item

    def close_spider(self) -> None:
        if reached(self.settings, "warm_shutdown"):
            stop_here()
