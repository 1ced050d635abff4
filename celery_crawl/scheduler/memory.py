"""Redis out of memory, as one scheduler lives through it.

A Redis at ``maxmemory`` (with ``noeviction``) refuses writes. Out of memory
is no damage: nothing is repaired. The scheduler keeps the requests it holds
and leases no more (a lease is a write Redis would refuse,
``queue/lua/include/room.lua``); its heartbeat tries a write that changes
nothing each beat (``Base.check_room``) and, once one goes through, leasing
goes on. Meanwhile its renewals were refused like every other process's, so
no expired lease is requeued for a lease time after Redis took writes again:
their holders renew them first.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)


class OutOfMemory:
    """Whether Redis refuses ``spider``'s scheduler writes for memory, and since when."""

    def __init__(self, spider: str, requeue_after: float, stats: StatsCollector | None) -> None:
        self.spider = spider
        self.requeue_after = requeue_after  # seconds: the longest lease time
        self.stats = stats
        self.since: float | None = None  # Redis refused a write for memory
        self._room_since = float("-inf")  # when writes went through again after that

    @property
    def full(self) -> bool:
        return self.since is not None

    def opened(self) -> None:
        """At open, as after an out-of-memory spell: Redis may have refused the renewals
        of the leases' holders until just now (this process may be opening because
        writes went through again), so the leases that expired meanwhile are left
        to them for one lease time."""
        self._room_since = time.monotonic()

    def refused(self, error: Exception, held: int) -> None:
        """Redis refused a write for memory: no more leases; the ``held`` ones are kept."""
        if self.since is not None:
            return
        self.since = time.monotonic()
        if self.stats is not None:
            self.stats.inc_value("celery_crawl/redis_out_of_memory")
        logger.error(
            "Redis is out of memory (%s): %s keeps the %d requests it holds and leases no"
            " more until Redis takes writes again; free memory in Redis or raise maxmemory",
            error,
            self.spider,
            held,
        )

    def room_again(self) -> bool:
        """A write went through: True if Redis was out of memory until now."""
        if self.since is None:
            return False
        gone = time.monotonic() - self.since
        logger.warning(
            "Redis takes writes again after %.0f s out of memory (%s)", gone, self.spider
        )
        self.since = None
        self._room_since = time.monotonic()
        return True

    @property
    def requeue_due(self) -> bool:
        """Whether expired leases may be requeued: not while Redis is out of memory,
        nor for a lease time after."""
        if self.since is not None:
            return False
        return time.monotonic() - self._room_since >= self.requeue_after
