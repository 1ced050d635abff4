"""The scheduler's write-behind buffer: requests, acks, job stats and dead letters, together.

The requests one callback yields, the acks of the responses whose processing
finished, the job stat changes and dead-letter records (requests that
could not be queued), and the jobs a callback asked to end, of the same moment,
reach Redis in one script call
(:meth:`celery_crawl.queue.Base.push_many`), ``delay`` seconds after the
first of them was buffered, or at once when ``batch_size`` requests wait.
The children always go in before, or with, their parent's ack, so a crash
never leaves a finished parent whose children are missing. Before a call
with acks is made, ``before_acks()`` runs once for all of them: the
scheduler has the items of those pages handed to the OS there
(:mod:`celery_crawl.hosting.feeds`). If it raises, those acks are not sent: their
leases expire and the pages are crawled again. ``let_go(members)`` is told of
each ack once it is written, once its items cannot be made durable, or once
Redis refuses its call: until then the process renews its lease
(:mod:`celery_crawl.scheduler.prefetch`). While Redis is away, nothing is let go.

If Redis is away, or refuses the script (a damaged key: ``on_error`` is
told, see :mod:`celery_crawl.core.repair`), the buffer keeps the call and sends it
again, unchanged, a second later, before anything buffered since: nothing
buffered is lost while the process lives. Each call carries this buffer's
number for it, so a call that Redis ran but whose reply was lost (Redis
stopped, a connection cut) is not applied twice when it is sent again: job
counters and dead letters are added once (``queue/lua/enqueue.lua``).

The buffer does not import Twisted. ``call_later(delay, fn)`` is injected
(the reactor's ``callLater`` in a crawl, a fake clock in tests, nothing when
driven by hand) and returns a timer with ``active()``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from scrapy import Request

from celery_crawl.core import connection
from celery_crawl.core.entries import Entry
from celery_crawl.jobs.stats import Deltas, JobStats
from celery_crawl.queue.queues import Base
from celery_crawl.scheduler.routing import Router

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


class Call(NamedTuple):
    """One write: sent whole, and on a retry sent again exactly as it was."""

    number: int
    pending: list[Pending]
    acks: list[bytes]
    ack_stats: list[Deltas]  # each ack's page's stats: counted only if its lease is held
    job_stats: list[tuple[str, str, int]]
    dead_letters: list[str]
    ends: list[tuple[str, str]]  # (job, reason): ended after the stats, before the acks


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
        before_acks: Callable[[], None] | None = None,
        let_go: Callable[[list[bytes]], None] | None = None,
        delay: float,
        batch_size: int,
    ) -> None:
        self.queue = queue
        self.on_written = on_written  # each pending request, and whether it was enqueued
        self.router = router
        self.call_later = call_later
        self.on_error = on_error
        self.before_acks = before_acks  # makes the acked pages' items durable, or raises
        self.let_go = let_go  # leases whose acks were written, or given up
        self.delay = delay
        self.batch_size = max(1, batch_size)
        self.pending: list[Pending] = []
        self.acks: list[bytes] = []
        self.dead_letters: list[str] = []
        self.ends: list[tuple[str, str]] = []
        self.job_stats = JobStats()
        self.ack_stats: list[Deltas] = []  # the stats of each of ``acks``' pages
        self.writer = uuid.uuid4().hex  # numbers this buffer's calls (``Base.push_many``)
        self.participant = ""  # its scheduler's id once it joins jobs: judges late stats
        self.unconfirmed: Call | None = None  # sent, not known to be applied: sent again first
        self._calls = 0
        self._timer: Timer | None = None

    def __len__(self) -> int:
        """Requests not known to be in Redis yet."""
        return len(self.pending) + (len(self.unconfirmed.pending) if self.unconfirmed else 0)

    def add(self, pending: Pending) -> None:
        self.pending.append(pending)
        if len(self.pending) >= self.batch_size:
            self.flush()
        else:
            self.schedule(self.delay)

    def ack(self, member: bytes, stats: Deltas | None = None) -> None:
        """Finish this lease at the next flush, after any request buffered before it; its
        page's job stats (:meth:`JobStats.release`) are written with it, or not at all, and
        count only if the lease is still held then (``queue/lua/enqueue.lua``)."""
        self.acks.append(member)
        self.ack_stats.append(stats or {})
        self.schedule(self.delay)

    def dead_letter(self, record: str) -> None:
        """Keep ``record`` in the dead-letter list at the next flush, before any ack after it."""
        self.dead_letters.append(record)
        self.schedule(self.delay)

    def end_job(self, job: str, reason: str) -> None:
        """End ``job`` (``closed``, ``reason``) at the next flush: after the stats of that
        call count in it, before its acks, so that an ack sent with it cannot end it done."""
        self.ends.append((job, reason))
        self.schedule(self.delay)

    def schedule(self, delay: float) -> None:
        if self.call_later is None or (self._timer is not None and self._timer.active()):
            return
        self._timer = self.call_later(delay, self.flush)

    def flush(self) -> None:
        """Send the call not known to be applied, if any; then what was buffered since."""
        if self.unconfirmed is not None and not self._send(self.unconfirmed):
            return
        call = self._take()
        if call is not None:
            self._send(call)

    def _take(self) -> Call | None:
        """Everything buffered, as the next call (None: nothing to write)."""
        acks = self._settled()
        # the acks' own stats go with them: an ack left out leaves its page's stats out too
        ack_stats = self.ack_stats if acks else []
        self.ack_stats = []
        job_stats = self.job_stats.drain()
        if not (self.pending or acks or job_stats or self.dead_letters or self.ends):
            self.acks = []
            return None
        pending = sorted(self.pending, key=lambda p: p.target or "")  # own first, then by target
        self._calls += 1
        call = Call(self._calls, pending, acks, ack_stats, job_stats, self.dead_letters, self.ends)
        self.pending, self.acks, self.dead_letters, self.ends = [], [], [], []
        return call

    def _settled(self) -> list[bytes]:
        """The acks to send: none if their pages' items could not be made durable."""
        if not self.acks or self.before_acks is None:
            return self.acks
        try:
            self.before_acks()
        except Exception:
            logger.exception(
                "the items of %d pages could not be made durable: their leases are not acked,"
                " so they expire and the pages are crawled again",
                len(self.acks),
            )
            self._let_go(self.acks)
            return []
        return self.acks

    def _send(self, call: Call) -> bool:
        """Write ``call`` in one round trip; False if Redis did not take it (kept, retried)."""
        try:
            own, routed = self._batches(call.pending)
            flags = self.queue.push_many(
                own,
                call.acks,
                call.job_stats,
                routed,
                call.dead_letters,
                ack_stats=call.ack_stats,
                ends=call.ends,
                call=(self.writer, call.number),
                participant=self.participant,
            )
        except connection.REFUSED_OR_TRANSIENT as exc:
            # Redis is away (restarting?) or a key is damaged: keep the call, send it again
            self.unconfirmed = call
            if isinstance(exc, connection.TRANSIENT_ERRORS):
                connection.warn_away(
                    logger,
                    "Redis unreachable; %d requests and %d acks kept",
                    len(call.pending),
                    len(call.acks),
                )
            else:  # refused: its acks no longer held, lest a refusal for good pin their pages
                self._let_go(call.acks)  # (sent again within their lease time, they land)
                if self.on_error is not None:
                    self.on_error(exc)
            self.schedule(RETRY_DELAY)
            return False
        self.unconfirmed = None
        self._let_go(call.acks)
        self.on_written(call.pending, flags)
        return True

    def _let_go(self, acks: list[bytes]) -> None:
        if acks and self.let_go is not None:
            self.let_go(acks)

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
