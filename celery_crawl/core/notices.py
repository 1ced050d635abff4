"""What Redis tells a process: work was pushed to a queue, a job ended. One thread per process.

The scripts that push work (``queue/lua/include/push.lua``, ``queue/lua/requeue.lua``, a
site's freed slot in ``politeness/lua/include/sites.lua``) publish on the queue's signal
channel, and ``job_notify`` (``jobs/lua/include/jobs.lua``) publishes on each
participant's list of ended jobs. Every scheduler of a process listens here,
through one subscriber connection and one thread, instead of blocking a
thread of its own on a pop: a worker that hosts 40 spiders, 39 of them idle,
holds one thread and sends Redis nothing while it waits.

A subscriber hears only what is published while it is subscribed. So a
handler also runs each time its channel's subscription is confirmed, at the
first subscribe and after every reconnection: the handler looks for itself
(a scheduler asks for a lease, a participant drains its list), so nothing
published while the connection was away is missed.

Handlers run in this module's thread: they must be short, and hand work to
the reactor with ``reactor.callFromThread``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from celery_crawl.core import connection

logger = logging.getLogger(__name__)

# the longest a new subscription waits to be sent, or a stop to be seen. Nothing is missed
# meanwhile (a handler runs when its subscription is confirmed), and an idle process's
# thread wakes twice a second: at 0.1 s, it used about 1% of a CPU (docs/benchmarks.md)
POLL_SECONDS = 0.5
RETRY_SECONDS = 1.0  # between tries while Redis is unreachable
REFUSED_RETRY_SECONDS = 30.0  # between tries when Redis refuses (an ACL user with no channel)

Handler = Callable[[], None]


class Notices:
    """One subscriber connection and one daemon thread; ``listen(channel, handler)``."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._handlers: dict[str, dict[int, Handler]] = {}
        self._lock = threading.Lock()
        self._changes: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_id = 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def listen(self, channel: str, handler: Handler) -> Callable[[], None]:
        """Call ``handler()`` on each message on ``channel``, and once subscribed; returns
        the function that stops it."""
        with self._lock:
            self._next_id += 1
            token = self._next_id
            self._handlers.setdefault(channel, {})[token] = handler
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="notices", daemon=True)
                self._thread.start()
        self._changes.put(channel)

        def stop_listening() -> None:
            with self._lock:
                handlers = self._handlers.get(channel, {})
                handlers.pop(token, None)
                if not handlers:
                    self._handlers.pop(channel, None)
            self._changes.put(channel)

        return stop_listening

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._serve()
            except connection.TRANSIENT_ERRORS as exc:
                connection.warn_away(
                    logger, "Redis unreachable, listening again in %s s: %s", RETRY_SECONDS, exc
                )
                self._stopped.wait(RETRY_SECONDS)
            except Exception:
                logger.exception(
                    "listening for notices failed; idle crawlers wake at Scrapy's engine"
                    " heartbeat until it works, tried again in %s s",
                    REFUSED_RETRY_SECONDS,
                )
                self._stopped.wait(REFUSED_RETRY_SECONDS)

    def _serve(self) -> None:
        """One subscriber connection, until it fails or :meth:`stop`; every channel anew."""
        pubsub = self.client.pubsub()
        subscribed: set[str] = set()
        try:
            with self._lock:
                self._queue_all()
            while not self._stopped.is_set():
                self._apply_changes(pubsub, subscribed)
                message = pubsub.get_message(timeout=POLL_SECONDS)
                if message is not None:
                    self._dispatch(message)
        finally:
            pubsub.close()

    def _queue_all(self) -> None:
        for channel in self._handlers:
            self._changes.put(channel)

    def _apply_changes(self, pubsub: Any, subscribed: set[str]) -> None:
        """(Un)subscribe what :meth:`listen` changed since; only this thread uses ``pubsub``."""
        wanted: set[str] = set()
        while not self._changes.empty():
            wanted.add(self._changes.get_nowait())
        with self._lock:
            listened = {channel for channel in wanted if channel in self._handlers}
        new = listened - subscribed
        for channel in sorted(listened - new):  # a listener added to a subscribed channel
            self._run_handlers(channel)  # gets its first call now, not at a confirmation
        if new:
            pubsub.subscribe(*sorted(new))
            subscribed |= new
        if gone := (wanted - listened) & subscribed:
            pubsub.unsubscribe(*sorted(gone))
            subscribed -= gone

    def _dispatch(self, message: dict[str, Any]) -> None:
        """A message, or a subscription's confirmation: run the channel's handlers."""
        if message.get("type") not in ("message", "subscribe"):
            return
        channel = message["channel"]
        self._run_handlers(channel.decode() if isinstance(channel, bytes) else str(channel))

    def _run_handlers(self, channel: str) -> None:
        with self._lock:
            handlers = list(self._handlers.get(channel, {}).values())
        for handler in handlers:
            try:
                handler()
            except connection.TRANSIENT_ERRORS as exc:
                logger.warning("a notice on %s not handled, Redis unreachable: %s", channel, exc)
            except Exception:
                logger.exception("handling a notice on %s failed", channel)


_processes: dict[tuple[int, int], Notices] = {}
_processes_lock = threading.Lock()


def _new_processes_lock() -> None:
    """In a forked child: a thread of the parent (a job tracker) may have held it at the fork,
    and the child inherits it held, with no thread to release it."""
    global _processes_lock  # noqa: PLW0603 - rebound in a forked child only
    _processes_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_processes_lock)


def notices_of(client: Any) -> Notices:
    """This process's :class:`Notices` for ``client`` (one per client, made at first use)."""
    key = (os.getpid(), id(client))
    with _processes_lock:
        notices = _processes.get(key)
        if notices is None:
            notices = _processes[key] = Notices(client)
        return notices
