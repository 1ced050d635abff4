"""Leases taken ahead of the engine's asks, and the leases the engine holds.

The engine asks the scheduler for one request at a time. Leasing them one
by one would cost a round trip each, so :class:`Prefetch` leases ``size`` at
once and hands them out one by one. It also remembers which lease each
request handed to the engine came from, so that the request's ack finds its
lease, and so that every lease this process holds can be renewed, or handed
back at shutdown. A lease is held until its ack is written: a page the engine
is done with may wait for the write-behind buffer's flush (a reactor held by a
long callback, items made durable first, Redis away), and its lease must not
lapse meanwhile, or another process crawls the page again.

The renewal runs in the scheduler's heartbeat thread
(:mod:`celery_crawl.core.heartbeat`), so :meth:`Prefetch.held` may be called from
another thread than the reactor's: a lock guards every change and that one read.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from celery_crawl.core.entries import Lease
from celery_crawl.jobs.signals import job_of


class Prefetch:
    """``lease(n)`` takes up to ``n`` leases from the queue (it may raise while Redis is away)."""

    def __init__(self, lease: Callable[[int], list[Lease]], size: int) -> None:
        self.lease = lease
        self.size = max(1, size)
        self.waiting: deque[Lease] = deque()  # leased, not yet handed to the engine
        self.handed: dict[Any, bytes] = {}  # request -> lease member, until the engine is done
        self.acking: set[bytes] = set()  # done by the engine, their acks not written yet
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.waiting)

    def next(self) -> Lease | None:
        """The next lease; ``size`` more are leased when none is left (None: queue empty)."""
        if not self.waiting:
            leased = self.lease(self.size)  # a round trip: not under the lock
            with self._lock:
                self.waiting.extend(leased)
        with self._lock:
            return self.waiting.popleft() if self.waiting else None

    def put_back(self, lease: Lease) -> None:
        """A lease taken by :meth:`next` but not handed out: it is next again."""
        with self._lock:
            self.waiting.appendleft(lease)

    def hand_out(self, request: Any, lease: Lease) -> None:
        with self._lock:
            self.handed[request] = lease.member

    def finish(self, request: Any) -> bytes | None:
        """The lease of a request the engine is done with, held until :meth:`let_go`;
        None if it was not ours."""
        with self._lock:
            member = self.handed.pop(request, None)
            if member is not None:
                self.acking.add(member)
            return member

    def finish_unhanded(self, lease: Lease) -> bytes:
        """A lease taken by :meth:`next`, never handed out, acked unprocessed: held until
        :meth:`let_go`."""
        with self._lock:
            self.acking.add(lease.member)
            return lease.member

    def let_go(self, members: list[bytes]) -> None:
        """Leases no longer held here: their acks were written, or they are left to expire."""
        with self._lock:
            self.acking.difference_update(members)

    def held(self) -> list[bytes]:
        """Every lease this process holds: waiting, handed to the engine, or being acked."""
        with self._lock:
            waiting = [lease.member for lease in self.waiting]
            return [*waiting, *self.handed.values(), *self.acking]

    def holds(self, job: str) -> bool:
        """Whether a lease of ``job`` is held here: waiting, or handed to the engine (one
        being acked is not counted: a process leaving a job flushes its acks first)."""
        with self._lock:
            return any(lease.job == job for lease in self.waiting) or any(
                job_of(request) == job for request in self.handed
            )

    def clear(self) -> None:
        with self._lock:
            self.waiting.clear()
            self.handed.clear()
            self.acking.clear()
