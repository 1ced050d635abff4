"""Waiting for work, and waking the engine when it may be there.

When nothing can be leased, the scheduler returns no request and the engine
waits. It is woken:

- when any process pushes work: the scripts that push publish on the queue's
  signal channel, which this process hears in its one notices thread
  (:mod:`celery_crawl.core.notices`): no thread and no Redis command per waiting
  scheduler; one wake-up at a time is on its way to the reactor;
- when a site parked at its limits is due (the lease said when:
  ``Base.next_ready``), by a timer in the reactor;
- when Redis takes writes again after it ran out of memory (the scheduler asks).

Scrapy's own 5-second heartbeat asks again in any case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery_crawl.core.notices import notices_of
from celery_crawl.scheduler.buffer import reactor_call_later

if TYPE_CHECKING:
    from celery_crawl.queue.queues import Base
    from celery_crawl.scheduler.engine import EngineHooks

DUE_MARGIN_SECONDS = 0.001  # a parked site's due time is in whole ms of the server's clock


class Wakeup:
    """The waiting of one scheduler, between its ``open`` and its ``close``."""

    def __init__(self, queue: Base, engine: EngineHooks) -> None:
        self.queue = queue
        self.engine = engine
        self.open = False  # wakes nothing before the scheduler opens, or after it closes
        self._stop_listening: Callable[[], None] | None = None  # to the queue's pushes
        self._wake_pending = False  # a wake-up of the engine is on its way to the reactor
        self._ready_call: Any = None  # the engine's wake-up when a parked site is due

    def listen(self) -> None:
        """Hear the queue's pushes, in the process's notices thread (with an engine only)."""
        self._stop_listening = notices_of(self.queue.client).listen(
            self.queue.keys.signal, self.on_push
        )

    def stop(self) -> None:
        """At close: no more wake-ups, no more listening."""
        self.open = False
        self._cancel_ready_call()
        if self._stop_listening is not None:
            self._stop_listening()

    def wait_for_work(self) -> None:
        """Nothing can be leased now: woken by a push, or when a parked site is due."""
        if self.open and self.engine.engine is not None:
            self._wake_when_due()

    def _wake_when_due(self) -> None:
        """Wake the engine when the first parked site may take a request (``next_ready``).

        A timer in the reactor, not a blocking pop's timeout: a server ends
        blocked clients' timeouts at its clock tick (``hz``, every 100 ms by
        default), which held a site limited to 10 requests/s to about 8.
        """
        due = self.queue.next_ready
        if due is None:
            return
        self._cancel_ready_call()
        self._ready_call = reactor_call_later(due + DUE_MARGIN_SECONDS, self.engine.wake)

    def _cancel_ready_call(self) -> None:
        if self._ready_call is not None and self._ready_call.active():
            self._ready_call.cancel()
        self._ready_call = None

    def on_push(self) -> None:
        """In any thread: work was pushed; one wake-up of the engine at a time."""
        if self._wake_pending or not self.open:
            return
        from twisted.internet import reactor

        self._wake_pending = True
        reactor.callFromThread(self._woken)

    def _woken(self) -> None:
        self._wake_pending = False
        if self.open:
            self.engine.wake()
