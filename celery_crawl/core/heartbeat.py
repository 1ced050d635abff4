"""Beats off the reactor: work that must go on while the reactor is busy.

A process proves it is alive by renewing what it holds in Redis: its leases
(:mod:`celery_crawl.scheduler.scheduler`) and its worker registration
(:mod:`celery_crawl.hosting.registry`). Renewed from the reactor, a callback that
holds the reactor for longer than a lease would let another process take the
same request. So every :class:`Heartbeat` of a process beats in one daemon
thread of its own (:class:`Beats`), not in the reactor: only a dead (or frozen)
process stops beating. One thread for all of them, not one each: a worker
hosting 40 spiders holds one beating thread, not 41.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
from collections.abc import Callable

from celery_crawl.core import connection

logger = logging.getLogger(__name__)


class Heartbeat:
    """Call ``renew()`` every ``interval`` seconds, off the reactor, until :meth:`stop`."""

    def __init__(self, name: str, renew: Callable[[], None], interval: float) -> None:
        self.name = name
        self.renew = renew
        self.interval = interval
        self.beating = threading.Lock()  # held while a beat runs
        self._started = False
        self._stopped = False

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    def start(self) -> None:
        self._started = True
        beats().add(self)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop beating; returns once a beat in progress has ended (or ``timeout`` passed)."""
        self._stopped = True
        if beats().in_thread():
            return
        if self.beating.acquire(timeout=timeout):
            self.beating.release()

    def run_once(self) -> None:
        """One beat, its errors logged: the next one is due all the same."""
        with self.beating:
            if self._stopped:
                return
            try:
                self.renew()
            except connection.TRANSIENT_ERRORS as exc:
                connection.warn_away(
                    logger, "%s: Redis unreachable, will retry: %s", self.name, exc
                )
            except Exception:
                logger.exception("%s failed; will retry", self.name)


class Beats:
    """The process's beating thread: runs each heartbeat when it is due, in due order."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Heartbeat]] = []  # a heap: (due time, order, beat)
        self._added = 0
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)

    def add(self, heartbeat: Heartbeat) -> None:
        with self._changed:
            self._push(heartbeat, time.monotonic() + heartbeat.interval)
            if not self._thread.is_alive():
                self._thread.start()
            self._changed.notify()

    def in_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _push(self, heartbeat: Heartbeat, due: float) -> None:
        self._added += 1
        heapq.heappush(self._due, (due, self._added, heartbeat))

    def _run(self) -> None:
        while True:
            heartbeat = self._next_due()
            started = time.monotonic()
            heartbeat.run_once()
            took = time.monotonic() - started
            if took > heartbeat.interval:  # the process's other beats waited that long
                logger.warning("%s took %.1f s, longer than its interval", heartbeat.name, took)
            if heartbeat.running:
                with self._changed:
                    self._push(heartbeat, time.monotonic() + heartbeat.interval)

    def _next_due(self) -> Heartbeat:
        """Wait for the first heartbeat that is due and still running; drop stopped ones."""
        with self._changed:
            while True:
                while self._due and not self._due[0][2].running:
                    heapq.heappop(self._due)
                wait = self._due[0][0] - time.monotonic() if self._due else None
                if wait is not None and wait <= 0:
                    return heapq.heappop(self._due)[2]
                self._changed.wait(wait)


_beats: dict[int, Beats] = {}
_beats_lock = threading.Lock()


def _new_beats_lock() -> None:
    """In a forked child: a thread of the parent (a job tracker) may have held it at the fork,
    and the child inherits it held, with no thread to release it."""
    global _beats_lock  # noqa: PLW0603 - rebound in a forked child only
    _beats_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_beats_lock)


def beats() -> Beats:
    """This process's :class:`Beats` (a forked child makes its own)."""
    with _beats_lock:
        found = _beats.get(os.getpid())
        if found is None:
            found = _beats[os.getpid()] = Beats()
        return found
