"""Shared, exact request dedup.

Fingerprints come from the crawler's ``request_fingerprinter`` (so
``REQUEST_FINGERPRINTER_CLASS`` is respected) and are stored as binary
digests in bucketed Redis sets; ``lua/dedup_exact.lua`` has the layout. The
scheduler runs the check inside its enqueue script, so check and enqueue are
one atomic step; ``request_seen`` runs it alone, for use outside a scheduler.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar, Self

import redis
from scrapy import Request, Spider

from celery_crawl import connection, scripts
from celery_crawl.keys import SpiderKeys

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class RFPDupeFilter:
    """Exact dedup shared by every process that points at the same Redis."""

    lua: ClassVar[str] = "dedup_exact"

    def __init__(
        self,
        client: redis.Redis,
        keys: SpiderKeys,
        fingerprinter: Any,
        debug: bool = False,
        stats: Any = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.fingerprinter = fingerprinter
        self.debug = debug
        self.stats = stats
        self._logged_first = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(
            connection.from_settings(crawler.settings),
            SpiderKeys.from_settings(crawler.spidercls.name, crawler.settings),
            crawler.request_fingerprinter,
            debug=crawler.settings.getbool("DUPEFILTER_DEBUG"),
            stats=crawler.stats,
        )

    def fingerprint(self, request: Request) -> bytes:
        return bytes(self.fingerprinter.fingerprint(request))

    def request_seen(self, request: Request) -> bool:
        return not self.add_fingerprints([self.fingerprint(request)])[0]

    def add_fingerprints(self, fingerprints: list[bytes]) -> list[bool]:
        """Record fingerprints atomically; a flag per fingerprint, True = it was new."""
        flags = self._run("add", *fingerprints)
        return [bool(flag) for flag in flags]

    def __len__(self) -> int:
        return int(self.client.get(self.keys.dupefilter_count) or 0)

    def memory_usage(self) -> int:
        """Bytes used by the filter's keys, as Redis reports them."""
        return int(self._run("memory"))

    def clear(self) -> None:
        self._run("clear")

    def _run(self, *args: Any) -> Any:
        keys = [self.keys.dupefilter, self.keys.dupefilter_count]
        return scripts.script(self.client, "dedup", dedup=self.lua)(keys=keys, args=list(args))

    def open(self) -> None:
        """Scrapy's dupefilter hook; nothing to set up, the keys are shared."""

    def close(self, reason: str = "") -> None:
        """Scrapy's dupefilter hook; the filter persists or is cleared by the scheduler."""

    def log(self, request: Request, spider: Spider) -> None:
        if self.debug:
            logger.debug("Filtered duplicate request: %(request)s", {"request": request})
        elif not self._logged_first:
            logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
            )
            self._logged_first = True
        if self.stats is not None:
            self.stats.inc_value("dupefilter/filtered")


DUPEFILTER_CLASSES: dict[str, type[RFPDupeFilter]] = {
    "celery_crawl.dupefilter.RFPDupeFilter": RFPDupeFilter,
    "scrapy_redis.dupefilter.RFPDupeFilter": RFPDupeFilter,
}
