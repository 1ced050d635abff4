"""A beat in a thread of its own: work that must go on while the reactor is busy.

A process proves it is alive by renewing what it holds in Redis: its leases
(:mod:`celery_crawl.scheduler`) and its worker registration
(:mod:`celery_crawl.registry`). Renewed from the reactor, a callback that
holds the reactor for longer than a lease would let another process take the
same request. :class:`Heartbeat` runs the renewal in a daemon thread instead,
so only a dead (or frozen) process stops beating.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from celery_crawl.connection import TRANSIENT_ERRORS

logger = logging.getLogger(__name__)


class Heartbeat:
    """Call ``beat()`` every ``interval`` seconds in a daemon thread, until :meth:`stop`."""

    def __init__(self, name: str, beat: Callable[[], None], interval: float) -> None:
        self.name = name
        self.beat = beat
        self.interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat: {name}", daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop beating; returns once a beat in progress has ended (or ``timeout`` passed)."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                self.beat()
            except TRANSIENT_ERRORS as exc:
                logger.warning("%s: Redis unreachable, will retry: %s", self.name, exc)
            except Exception:
                logger.exception("%s failed; will retry", self.name)
