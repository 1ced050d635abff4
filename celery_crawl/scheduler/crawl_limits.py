"""``CLOSESPIDER_PAGECOUNT``, ``_ITEMCOUNT``, ``_ERRORCOUNT`` and ``_TIMEOUT`` for the whole crawl.

Scrapy's ``CloseSpider`` extension counts what its own process saw, so two
processes with ``CLOSESPIDER_PAGECOUNT = 50`` crawled about 100 pages. With
``CLOSESPIDER_SCOPE = "crawl"`` (the default), the scheduler also holds the
crawl to them: each page, item or callback error adds one to a crawl-wide
count in the crawl's hash (one ``HINCRBY``, :mod:`celery_crawl.scheduler.crawl_state`),
and the process whose count reaches a limit, or that reads it reached (every
``POLL_SECONDS``), closes with Scrapy's reason and leases nothing more. The
timeout counts from the crawl's start, on the server's clock.

Requests already downloading when the limit is reached still finish, as in
Scrapy: a crawl may go past a count limit by up to ``CONCURRENT_REQUESTS`` per
process. Scrapy's extension stays on: its per-process counts never reach a
limit before the crawl-wide ones do.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals

from celery_crawl.core import connection
from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.jobs.limits import LIMITS
from celery_crawl.scheduler.buffer import reactor_call_later
from celery_crawl.scheduler.crawl_state import Crawl, Opened
from celery_crawl.scheduler.engine import EngineHooks

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

SCOPES = ("crawl", "process", "job")  # CLOSESPIDER_SCOPE
POLL_SECONDS = 1.0  # a process reads the crawl-wide counts this often
# crawl-wide count (a field of the crawl's hash, a limit of jobs.LIMITS) -> the signal it counts
COUNTED = {
    "pages": signals.response_received,
    "items": signals.item_scraped,
    "errors": signals.spider_error,
}


class CrawlLimits:
    """The ``CLOSESPIDER_*`` limits of one process, held for the crawl it takes part in."""

    def __init__(
        self, crawler: Crawler, crawl: Crawl, counts: dict[str, int], timeout: float
    ) -> None:
        self.crawler = crawler
        self.crawl = crawl
        self.counts = counts  # count -> its limit, for the limits set
        self.timeout = timeout
        self.reason: str | None = None  # set once a limit is reached
        self._calls: list[Any] = []

    @classmethod
    def for_crawler(cls, crawler: Crawler, crawl: Crawl) -> CrawlLimits | None:
        """The crawl's limits, or None: no limit set, or ``CLOSESPIDER_SCOPE`` is not ``crawl``."""
        scope = setting(crawler.settings, "CLOSESPIDER_SCOPE")
        if scope not in SCOPES:
            raise ConfigError(f"CLOSESPIDER_SCOPE is {scope!r}: use 'crawl' or 'process'")
        settings = crawler.settings
        counts = {name: settings.getint(LIMITS[name][0]) for name in COUNTED}
        counts = {name: limit for name, limit in counts.items() if limit > 0}
        timeout = settings.getfloat(LIMITS["seconds"][0])
        if scope != "crawl" or not (counts or timeout > 0):
            return None
        return cls(crawler, crawl, counts, timeout)

    def start(self, opened: Opened) -> None:
        """Count this process's pages, items and errors; close at a limit or the timeout."""
        from twisted.internet import task

        for name in self.counts:
            self.crawler.signals.connect(self._counter(name), signal=COUNTED[name], weak=False)
        if self.counts:
            poll = task.LoopingCall(self.poll)
            poll.start(POLL_SECONDS, now=False)
            self._calls.append(poll)
        if self.timeout > 0:
            remaining = max(0.0, self.timeout - opened.elapsed)
            self._calls.append(reactor_call_later(remaining, lambda: self.reach("seconds")))

    def stop(self) -> None:
        for call in filter(None, self._calls):
            if getattr(call, "running", False):
                call.stop()
            elif getattr(call, "active", lambda: False)():
                call.cancel()
        self._calls.clear()

    def _counter(self, name: str) -> Any:
        def count(*args: Any, **kwargs: Any) -> None:
            self.add(name)

        return count

    def add(self, name: str) -> None:
        """One more page, item or error for the crawl; close if it reaches the limit."""
        if self.reason is not None:
            return
        try:
            value = self.crawl.count(name)
        except connection.REFUSED_OR_TRANSIENT as exc:  # that one goes uncounted
            connection.warn_away(
                logger, "Redis unreachable, a crawl-wide %s not counted: %s", name, exc
            )
            return
        if value >= self.counts[name]:
            self.reach(name)

    def poll(self) -> None:
        """Read the crawl-wide counts: another process may have reached a limit."""
        try:
            counts = self.crawl.counts()
        except connection.REFUSED_OR_TRANSIENT as exc:
            connection.warn_away(logger, "Redis unreachable, crawl-wide counts not read: %s", exc)
            return
        for name, limit in self.counts.items():
            if counts[name] >= limit:
                self.reach(name)
                return

    def reach(self, name: str) -> None:
        """Close this process's spider with Scrapy's reason for limit ``name`` (once)."""
        if self.reason is not None:
            return
        self.reason = LIMITS[name][1]
        logger.info("crawl-wide limit %s reached: closing (%s)", LIMITS[name][0], self.reason)
        self.stop()
        EngineHooks(self.crawler).close_spider(self.reason)
