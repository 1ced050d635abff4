"""The scheduler's write-behind buffer: requests, acks, job stats and dead letters, together.

The requests one callback yields, the acks of the responses whose processing
finished, and the job stat changes and dead-letter records (requests that
could not be queued) of the same moment reach Redis in one script call
(:meth:`celery_crawl.queue.Base.push_many`), ``delay`` seconds after the
first of them was buffered, or at once when ``batch_size`` requests wait.
The children always go in before, or with, their parent's ack, so a crash
never leaves a finished parent whose children are missing.

If Redis is away, or refuses the script (a damaged key: ``on_error`` is
told, see :mod:`celery_crawl.repair`), the buffer keeps everything and tries
again a second later: nothing buffered is lost while the process lives.

The buffer does not import Twisted. ``call_later(delay, fn)`` is injected
(the reactor's ``callLater`` in a crawl, a fake clock in tests, nothing when
driven by hand) and returns a timer with ``active()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from scrapy import Request

from celery_crawl import connection
from celery_crawl.jobs import JobStats
from celery_crawl.queue import Base, Entry
from celery_crawl.routing import Router

logger = logging.getLogger(__name__)

RETRY_DELAY = 1.0  # seconds before a flush that found Redis away is tried again


class Timer(Protocol):
    def active(self) -> bool: ...


CallLater = Callable[[float, Callable[[], None]], Timer | None]


class Pending(NamedTuple):
    """A request buffered until the next flush; ``target`` is another spider, if routed."""

    request: Request
    entry: Entry
    target: str | None


class WriteBehind:
    """Buffered requests, acks, job stats and dead-letter records of one scheduler."""

    def __init__(
        self,
        queue: Base,
        on_written: Callable[[list[Pending], list[bool]], None],
        *,
        router: Router | None = None,
        call_later: CallLater | None = None,
        on_error: Callable[[Exception], None] | None = None,
        delay: float,
        batch_size: int,
    ) -> None:
        self.queue = queue
        self.on_written = on_written  # each pending request, and whether it was enqueued
        self.router = router
        self.call_later = call_later
        self.on_error = on_error
        self.delay = delay
        self.batch_size = max(1, batch_size)
        self.pending: list[Pending] = []
        self.acks: list[bytes] = []
        self.dead_letters: list[str] = []
        self.job_stats = JobStats()
        self._timer: Timer | None = None

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, pending: Pending) -> None:
        self.pending.append(pending)
        if len(self.pending) >= self.batch_size:
            self.flush()
        else:
            self.schedule(self.delay)

    def ack(self, member: bytes) -> None:
        """Finish this lease at the next flush, after any request buffered before it."""
        self.acks.append(member)
        self.schedule(self.delay)

    def dead_letter(self, record: str) -> None:
        """Keep ``record`` in the dead-letter list at the next flush, before any ack after it."""
        self.dead_letters.append(record)
        self.schedule(self.delay)

    def schedule(self, delay: float) -> None:
        if self.call_later is None or (self._timer is not None and self._timer.active()):
            return
        self._timer = self.call_later(delay, self.flush)

    def flush(self) -> None:
        """Write buffered requests, job stats and acks to Redis in one round trip."""
        job_stats = self.job_stats.drain()
        if not (self.pending or self.acks or job_stats or self.dead_letters):
            return
        pending = sorted(self.pending, key=lambda p: p.target or "")  # own first, then by target
        acks, letters = self.acks, self.dead_letters
        self.pending, self.acks, self.dead_letters = [], [], []
        try:
            own, routed = self._batches(pending)
            flags = self.queue.push_many(own, acks, job_stats, routed, letters)
        except connection.REFUSED_OR_TRANSIENT as exc:
            # Redis is away (restarting?) or a key is damaged: keep everything, try again
            self.pending, self.acks = pending + self.pending, acks + self.acks
            self.dead_letters = letters + self.dead_letters
            self.job_stats.restore(job_stats)
            if isinstance(exc, connection.TRANSIENT_ERRORS):
                logger.warning(
                    "Redis unreachable; %d requests and %d acks kept", len(pending), len(acks)
                )
            elif self.on_error is not None:
                self.on_error(exc)
            self.schedule(RETRY_DELAY)
            return
        self.on_written(pending, flags)

    def _batches(
        self, pending: list[Pending]
    ) -> tuple[list[Entry], list[tuple[Base, list[Entry]]]]:
        """The spider's own entries, and the routed ones per target queue (``pending`` sorted)."""
        own = [p.entry for p in pending if not p.target]
        routed: dict[str, list[Entry]] = {}
        for p in pending:
            if p.target:
                routed.setdefault(p.target, []).append(p.entry)
        if not routed:
            return own, []
        assert self.router is not None  # the scheduler admits only routable targets
        return own, [(self.router.queue(target), batch) for target, batch in routed.items()]


def reactor_call_later(delay: float, fn: Callable[[], None]) -> Any:
    """``reactor.callLater`` while the reactor runs; nothing before it starts."""
    from twisted.internet import reactor

    if not reactor.running:
        return None
    return reactor.callLater(delay, fn)  # type: ignore[arg-type]
