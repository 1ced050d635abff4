"""The Scrapy scheduler over the shared Redis queue.

A request's path through it:

1. ``enqueue_request`` encodes the request and buffers it; the buffer is
   written ``SCHEDULER_FLUSH_DELAY`` (10 ms) later, so the requests one
   callback yields, and the acks of several responses, reach Redis together
   (``flush``).
2. ``flush`` runs ``lua/enqueue.lua`` once: dedup check, enqueue, and the ack
   of the requests whose processing finished since the last flush. Requests
   routed to another spider of the group (``celery_crawl.routing``) go into
   that spider's queue in the same call, so children and their parent's ack
   are one atomic step whichever queue the children are for.
3. ``next_request`` leases a few requests at a time (``SCHEDULER_PREFETCH``)
   and hands them to the engine one by one.
4. When the engine is done with a request (response parsed and every child
   handed to ``enqueue_request``, or the request failed for good), its lease
   is acked by the next flush, after the children.
5. Leases that expire (a process died) are put back by any running
   scheduler; leases held at close are handed back at once.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections import deque
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Self

from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from twisted.python.failure import Failure

from celery_crawl import connection
from celery_crawl.components import dupefilter_class, queue_class
from celery_crawl.dupefilter import RFPDupeFilter
from celery_crawl.errors import ConfigError, DecodeError, EncodeError
from celery_crawl.jobs import JobStats, job_of
from celery_crawl.queue import Base, Entry, Lease
from celery_crawl.routing import Router, target_of
from celery_crawl.serializer import Codec, codec_from_name

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class Pending(NamedTuple):
    """A request buffered until the next flush; ``target`` is another spider, if routed."""

    request: Request
    entry: Entry
    target: str | None


class Scheduler(BaseScheduler):
    """``SCHEDULER = "celery_crawl.scheduler.Scheduler"``."""

    def __init__(
        self,
        queue: Base,
        dupefilter: RFPDupeFilter,
        codec: Codec,
        *,
        crawler: Crawler | None = None,
        persist: bool = False,
        flush_on_start: bool = False,
        idle_before_close: float = 0.0,
        prefetch: int = 16,
        batch_size: int = 500,
        requeue_interval: float = 5.0,
        deadletter_max: int = 10_000,
        wake_timeout: float = 1.0,
        flush_delay: float = 0.01,
        router: Router | None = None,
    ) -> None:
        self.queue = queue
        self.router = router
        self.df = dupefilter
        self.codec = codec
        self.crawler = crawler
        self.stats = crawler.stats if crawler is not None else None
        self.persist = persist
        self.flush_on_start = flush_on_start
        self.idle_before_close = idle_before_close
        self.prefetch = max(1, prefetch)
        self.batch_size = max(1, batch_size)
        self.requeue_interval = requeue_interval
        self.deadletter_max = deadletter_max
        self.spider: Spider | None = None
        self._pending: list[Pending] = []
        self._acks: list[bytes] = []
        self._prefetched: deque[Lease] = deque()
        self._leases: dict[Request, bytes] = {}
        self._flush_call: Any = None
        self._maintenance: Any = None
        self._empty_since: float | None = None
        self.wake_timeout = wake_timeout
        self.flush_delay = flush_delay
        self._waiting = False
        self._open = False
        self.job_stats = JobStats()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        client = connection.from_settings(settings)
        dupefilter = dupefilter_class(settings).from_crawler(crawler)
        queue = queue_class(settings)(
            client,
            dupefilter.keys,
            lease_seconds=settings.getfloat("SCHEDULER_LEASE_SECONDS", 300.0),
            dedup=dupefilter.script,
            ack_replicas=settings.getint("CELERY_CRAWL_ACK_REPLICAS", 0),
            ack_timeout=settings.getfloat("CELERY_CRAWL_ACK_TIMEOUT", 1.0),
        )
        return cls(
            queue,
            dupefilter,
            codec_from_name(settings.get("SCHEDULER_SERIALIZER")),
            crawler=crawler,
            router=Router(queue, settings),
            persist=settings.getbool("SCHEDULER_PERSIST", False),
            flush_on_start=settings.getbool("SCHEDULER_FLUSH_ON_START", False),
            idle_before_close=settings.getfloat("SCHEDULER_IDLE_BEFORE_CLOSE", 0.0),
            prefetch=settings.getint("SCHEDULER_PREFETCH", 16),
            batch_size=settings.getint("SCHEDULER_BATCH_SIZE", 500),
            requeue_interval=settings.getfloat("SCHEDULER_REQUEUE_INTERVAL", 5.0),
            deadletter_max=settings.getint("SCHEDULER_DEADLETTER_MAX", 10_000),
            flush_delay=settings.getfloat("SCHEDULER_FLUSH_DELAY", 0.01),
        )

    # -- lifecycle ---------------------------------------------------------

    def open(self, spider: Spider) -> None:
        self.spider = spider
        self._open = True
        connection.check(self.queue.client)
        if self.flush_on_start:
            self.clear()
        self.df.open()
        self.queue.requeue_expired()
        engine = self._engine()
        if engine is not None:
            self._watch_engine(engine)
            self._start_maintenance()
        if self.crawler is not None:
            self.job_stats.connect(self.crawler.signals)

    def _engine(self) -> Any:
        """The running engine; None when the scheduler is driven by hand (tests, benchmarks)."""
        try:
            return self.crawler.engine if self.crawler is not None else None
        except RuntimeError:  # Crawler.engine before the crawl started
            return None

    def close(self, reason: str) -> None:
        self._open = False
        if self._maintenance is not None and self._maintenance.running:
            self._maintenance.stop()
        self.flush()
        self.queue.release(self._held())
        self._prefetched.clear()
        self._leases.clear()
        if not self.persist:
            self.clear()

    def _held(self) -> list[bytes]:
        """The leases this process holds: prefetched, or handed to the engine."""
        return [lease.member for lease in self._prefetched] + list(self._leases.values())

    def clear(self) -> None:
        """Forget the queue and the dedup filter (``SCHEDULER_FLUSH_ON_START``)."""
        self.queue.clear()
        self.df.clear()

    def _watch_engine(self, engine: Any) -> None:
        """Ack each request when the engine drops it from its in-progress set.

        That happens after the response went through the callback and every
        request it yielded reached ``enqueue_request``, or after the request
        failed for good (errback done, or ignored by a middleware).
        """
        slot = getattr(engine, "_slot", None)
        if slot is None or not hasattr(slot, "remove_request"):
            raise ConfigError("this Scrapy version's engine has no slot to watch for acks")
        remove_request = slot.remove_request

        def remove_and_ack(request: Request) -> None:
            remove_request(request)
            self.ack(request)

        slot.remove_request = remove_and_ack

    def _start_maintenance(self) -> None:
        from twisted.internet import task

        interval = min(self.requeue_interval, self.queue.lease_seconds / 3)
        self._maintenance = task.LoopingCall(self.maintain)
        self._maintenance.start(interval, now=False)

    def maintain(self) -> None:
        """Requeue leases that expired anywhere; renew the leases this process holds."""
        try:
            self.flush()
            requeued = self.queue.requeue_expired()
            self.queue.extend(self._held())
        except connection.TRANSIENT_ERRORS as exc:
            logger.warning("Redis unreachable, scheduler maintenance will retry: %s", exc)
            return
        except Exception:
            logger.exception("scheduler maintenance failed; will retry")
            return
        if requeued:
            logger.info("requeued %d requests whose lease expired", requeued)
            self._inc("scheduler/requeued/expired", requeued)

    # -- enqueue -----------------------------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        assert self.spider is not None, "scheduler not open"
        try:
            payload = self.codec.encode(request, self.spider)
        except EncodeError as exc:
            logger.error("dropped a request that cannot be queued: %s", exc)
            self._inc("scheduler/unserializable")
            return False
        target = target_of(request, self.spider.name)
        if target is not None and not self._routable(target):
            return False
        fingerprint = None if request.dont_filter else self.df.fingerprint(request)
        job = job_of(request)
        if request.meta.get("retry_times"):
            self.job_stats.add(job, "retries")
        entry = Entry(payload, request.priority, fingerprint, job)
        self._pending.append(Pending(request, entry, target))
        if len(self._pending) >= self.batch_size:
            self.flush()
        else:
            self._schedule_flush(self.flush_delay)
        return True

    def _routable(self, target: str) -> bool:
        try:
            if self.router is None:
                raise ConfigError("this scheduler routes no requests to other spiders")
            self.router.queue(target)
        except ConfigError as exc:
            logger.error("dropped a request: %s", exc)
            self._inc("scheduler/unroutable")
            return False
        return True

    def ack(self, request: Request) -> None:
        """The engine is done with ``request``: finish its lease at the next flush."""
        member = self._leases.pop(request, None)
        if member is not None:
            self._acks.append(member)
            self._schedule_flush(self.flush_delay)

    def _schedule_flush(self, delay: float = 0.0) -> None:
        if self._flush_call is not None and self._flush_call.active():
            return
        from twisted.internet import reactor

        if reactor.running:
            self._flush_call = reactor.callLater(delay, self.flush)  # type: ignore[arg-type]

    def flush(self) -> None:
        """Write buffered requests, job stats and acks to Redis in one round trip."""
        job_stats = self.job_stats.drain()
        if not self._pending and not self._acks and not job_stats:
            return
        pending, acks = self._pending, self._acks
        self._pending, self._acks = [], []
        pending = sorted(pending, key=lambda p: p.target or "")  # own first, then by target
        try:
            own, routed = self._batches(pending)
            flags = self.queue.push_many(own, acks, job_stats, routed)
        except connection.TRANSIENT_ERRORS:
            # Redis is away (restarting?): keep everything for the next flush
            self._pending, self._acks = pending + self._pending, acks + self._acks
            self.job_stats.restore(job_stats)
            logger.warning(
                "Redis unreachable; %d requests and %d acks kept", len(pending), len(acks)
            )
            self._schedule_flush(delay=1.0)
            return
        self._accepted(pending, flags)

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
        assert self.router is not None  # enqueue_request admitted only routable targets
        return own, [(self.router.queue(target), batch) for target, batch in routed.items()]

    def _accepted(self, pushed: list[Pending], flags: list[bool]) -> None:
        for item, accepted in zip(pushed, flags, strict=True):
            if not accepted:
                self._on_duplicate(item.request)
        self._inc("scheduler/enqueued/redis", sum(flags))
        self._inc("scheduler/enqueued", sum(flags))

    def _on_duplicate(self, request: Request) -> None:
        """Not enqueued: seen before, or its job was cancelled meanwhile."""
        assert self.spider is not None
        self.df.log(request, self.spider)
        self.job_stats.add(job_of(request), "duplicates")
        if self.crawler is not None:
            self.crawler.signals.send_catch_log(
                signals.request_dropped, request=request, spider=self.spider
            )

    # -- dequeue -----------------------------------------------------------

    def next_request(self) -> Request | None:
        while self._prefetched or self._refill():
            lease = self._prefetched.popleft()
            request = self._decode(lease)
            if request is not None:
                self._leases[request] = lease.member
                self._inc("scheduler/dequeued/redis")
                self._inc("scheduler/dequeued")
                return request
        self._wait_for_work()
        return None

    def _wait_for_work(self) -> None:
        """While the queue is empty, block in a thread on the wake-up list.

        A push by any process wakes the engine at once, instead of at its next
        5-second heartbeat.
        """
        if self._waiting or not self._open or self._engine() is None:
            return
        from twisted.internet import threads

        self._waiting = True
        waiting = threads.deferToThread(self.queue.wait, self.wake_timeout)
        waiting.addBoth(self._woken)

    def _woken(self, result: Any) -> None:
        """Wake the engine: at once after a push, ``wake_timeout`` later if Redis is away."""
        self._waiting = False
        failed = isinstance(result, Failure)
        if failed:
            logger.warning("waiting for work failed: %s", result.getErrorMessage())
        slot = getattr(self._engine(), "_slot", None) if self._open else None
        if slot is not None:  # after a failure, a delay: no tight loop against a dead server
            slot.nextcall.schedule(self.wake_timeout if failed else 0)

    def _refill(self) -> bool:
        try:
            self.flush()  # our own children first, so that they can be leased
            self._prefetched.extend(self.queue.lease(self.prefetch))
        except connection.TRANSIENT_ERRORS as exc:
            logger.warning("Redis unreachable, no request leased: %s", exc)
        return bool(self._prefetched)

    def _decode(self, lease: Lease) -> Request | None:
        assert self.spider is not None
        try:
            return self.codec.decode(lease.payload, self.spider)
        except DecodeError as exc:
            self.dead_letter(lease, exc)
            return None

    def dead_letter(self, lease: Lease, error: DecodeError) -> None:
        """Move an entry that cannot become a request out of the queue, with the reason."""
        record = {
            "reason": error.kind,
            "error": str(error),
            "spider": self.queue.keys.spider,
            "at": datetime.now(UTC).isoformat(),
            "entry": base64.b64encode(lease.payload).decode("ascii"),
        }
        with self.queue.client.pipeline(transaction=True) as pipe:
            pipe.lpush(self.queue.keys.deadletter, json.dumps(record))
            pipe.ltrim(self.queue.keys.deadletter, 0, self.deadletter_max - 1)
            pipe.execute()
        self.job_stats.add(lease.job, f"errors/dead_letter/{error.kind}")
        self._acks.append(lease.member)  # finished: its job must not wait for it
        self.flush()
        logger.warning("dead-lettered a queue entry (%s): %s", error.kind, error)
        self._inc(f"celery_crawl/dead_letter/{error.kind}")

    def has_pending_requests(self) -> bool:
        if self._pending or self._prefetched:
            return True
        try:
            queued = len(self.queue)
        except connection.TRANSIENT_ERRORS:
            return True  # cannot tell: stay open until Redis answers again
        if queued > 0:
            self._empty_since = None
            return True
        return self._waiting_before_close()

    def _waiting_before_close(self) -> bool:
        if self.idle_before_close <= 0:
            return False
        now = time.monotonic()
        if self._empty_since is None:
            self._empty_since = now
        return now - self._empty_since < self.idle_before_close

    def __len__(self) -> int:
        return len(self.queue) + len(self._pending) + len(self._prefetched)

    def _inc(self, key: str, count: int = 1) -> None:
        if self.stats is not None and count:
            self.stats.inc_value(key, count)
