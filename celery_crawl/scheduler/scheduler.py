"""The Scrapy scheduler over the shared Redis queue.

A request's path through it:

1. ``enqueue_request`` encodes the request and hands it to the write-behind
   buffer (:mod:`celery_crawl.scheduler.buffer`), which writes it
   ``SCHEDULER_FLUSH_DELAY`` (10 ms) later, so that the requests one
   callback yields, and the acks of several responses, reach Redis together.
2. A flush runs ``queue/lua/enqueue.lua`` once: dedup check, enqueue, and the ack
   of the requests whose processing finished since the last flush. Requests
   routed to another spider of the group (:mod:`celery_crawl.scheduler.routing`) go
   into that spider's queue in the same call, so children and their
   parent's ack are one atomic step whichever queue the children are for.
3. ``next_request`` leases a few requests at a time (``SCHEDULER_PREFETCH``,
   :mod:`celery_crawl.scheduler.prefetch`) and hands them to the engine one by one.
4. When the engine is done with a request (response parsed and every child
   handed to ``enqueue_request``, or the request failed for good:
   :mod:`celery_crawl.scheduler.engine`), its lease is acked by the next flush, after
   the children, and after the handlers of ``acks_due`` made the items its
   callback yielded durable (the feeds' files flushed: :mod:`celery_crawl.hosting.feeds`).
5. A process renews the leases it holds from a heartbeat thread
   (:mod:`celery_crawl.core.heartbeat`); leases whose process stopped beating
   expire (``SCHEDULER_LEASE_SECONDS``, 10 s) and are put back by any running
   scheduler's heartbeat; leases held at close are handed back at once.

A request that cannot be queued (its meta or callback cannot be encoded, or
it is routed outside the spider's group) is never silent: a record of it goes
to the dead-letter list, its job counts it (``dropped`` and
``errors/dropped/<kind>``, so the job ends ``incomplete``), the stats count it
(``scheduler/dropped/<kind>``), and the first of each kind is logged with
what to change. Record and job stat reach Redis in the next flush's script call.

Several processes may share the queue. One has work pending while anything is
queued or leased anywhere (a leased request may still yield children), so a
process that starts early or late does not close while work is still coming.
Each open scheduler is registered in Redis, renewed by its heartbeat; with
``SCHEDULER_PERSIST`` false, only the last one to close clears the queue and
the dedup filter, in the same script that unregisters it.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Self

import redis
from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from twisted.python.failure import Failure

from celery_crawl.codec.serializer import Codec, codec_from_settings
from celery_crawl.cookies.middleware import check_installed
from celery_crawl.core import compat, connection
from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.errors import ConfigError, DecodeError, EncodeError
from celery_crawl.core.heartbeat import Heartbeat
from celery_crawl.core.keys import SpiderKeys, group_members
from celery_crawl.core.notices import notices_of
from celery_crawl.core.repair import Repairer, retried
from celery_crawl.dupefilter.filters import RFPDupeFilter
from celery_crawl.hosting.spiders import RedisMixin
from celery_crawl.jobs.signals import JOB_ARGS_META, JOB_DEPTH_META, acks_due, job_close, job_of
from celery_crawl.jobs.store import end_lost_jobs
from celery_crawl.politeness import middleware as politeness
from celery_crawl.politeness.sites import SitePolicy, SiteState
from celery_crawl.queue.entries import Entry, Lease
from celery_crawl.queue.queues import Base
from celery_crawl.scheduler.buffer import Pending, WriteBehind, reactor_call_later
from celery_crawl.scheduler.components import dupefilter_class, queue_class
from celery_crawl.scheduler.crawl_limits import CrawlLimits
from celery_crawl.scheduler.crawl_state import START_MODES, Crawl, Opened, start_once
from celery_crawl.scheduler.engine import EngineHooks
from celery_crawl.scheduler.participation import JobInfo, Participation
from celery_crawl.scheduler.prefetch import Prefetch
from celery_crawl.scheduler.routing import Router, target_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

# what to change, per kind of request that cannot be queued
NEXT_STEPS = {
    "unserializable": "change what the request carries so that the request codec can encode it"
    " (see the error: a meta or cb_kwargs value, a callback that is not a method of the"
    " spider, a request class)",
    "unroutable": "route requests only to spiders of the same group (CELERY_CRAWL_SPIDER_GROUPS)",
    "refused_scheme": "queue http and https URLs only, or widen SCHEDULER_ALLOWED_SCHEMES",
    "refused_method": "use the methods SCHEDULER_ALLOWED_METHODS lists, or widen it",
}
DUE_MARGIN_SECONDS = 0.001  # a parked site's due time is in whole ms of the server's clock
MIN_REGISTRATION_SECONDS = 10.0  # outlives missed renewals; lapsed, a job stops waiting on it


class Scheduler(BaseScheduler):
    """``SCHEDULER = "celery_crawl.scheduler.Scheduler"``."""

    def __init__(
        self,
        queue: Base,
        dupefilter: RFPDupeFilter,
        codec: Codec,
        *,
        crawler: Crawler | None = None,
        persist: bool = SETTINGS["SCHEDULER_PERSIST"].default,
        flush_on_start: bool = SETTINGS["SCHEDULER_FLUSH_ON_START"].default,
        start_requests: str = SETTINGS["SCHEDULER_START_REQUESTS"].default,
        idle_before_close: float = SETTINGS["SCHEDULER_IDLE_BEFORE_CLOSE"].default,
        prefetch: int = SETTINGS["SCHEDULER_PREFETCH"].default,
        batch_size: int = SETTINGS["SCHEDULER_BATCH_SIZE"].default,
        requeue_interval: float = SETTINGS["SCHEDULER_REQUEUE_INTERVAL"].default,
        flush_delay: float = SETTINGS["SCHEDULER_FLUSH_DELAY"].default,
        router: Router | None = None,
        group: list[SpiderKeys] | None = None,
        allow_eviction: bool = SETTINGS["CELERY_CRAWL_ALLOW_EVICTION"].default,
    ) -> None:
        self.queue = queue
        self.router = router
        self.group = group or [queue.keys]  # every spider's keys, for jobs whose work is lost
        self.repairer = Repairer(queue.client, queue.keys, self.group)  # routed ones: theirs too
        self.df = dupefilter
        self.codec = codec
        self.crawler = crawler
        self.stats = crawler.stats if crawler is not None else None
        self.persist = persist
        self.allow_eviction = allow_eviction
        self.out_of_memory_since: float | None = None  # Redis refused a write for memory
        self._room_since = float("-inf")  # when writes went through again after that
        self.flush_on_start = flush_on_start
        if start_requests not in START_MODES:
            raise ConfigError(
                f"SCHEDULER_START_REQUESTS is {start_requests!r}: use 'once' or 'every'"
            )
        self.start_requests = start_requests
        self.idle_before_close = idle_before_close
        self.requeue_interval = requeue_interval
        self.spider: Spider | None = None
        self.engine = EngineHooks(crawler)
        self.buffer = WriteBehind(
            queue,
            self._written,
            router=router,
            call_later=reactor_call_later,
            on_error=self._refused,
            before_acks=self._settle_items,
            delay=flush_delay,
            batch_size=batch_size,
        )
        self.prefetch = Prefetch(self._lease, prefetch)
        self.job_stats = self.buffer.job_stats
        self._maintenance: Any = None
        self.heartbeat = Heartbeat(
            f"leases of {queue.keys.spider}", self.renew, self.maintenance_interval
        )
        self._empty_since: float | None = None
        self._stop_listening: Any = None  # this scheduler's subscription to its queue's pushes
        self._wake_pending = False  # a wake-up of the engine is on its way to the reactor
        self._ready_call: Any = None  # the engine's wake-up when a parked site is due
        self._open = False
        self.id = uuid.uuid4().hex  # this scheduler's registration among the open ones
        self.crawl = Crawl(queue.client, queue.keys, self.id)
        self.limits: CrawlLimits | None = None  # CLOSESPIDER_* for the whole crawl
        self._dropped_kinds: set[str] = set()  # logged once per kind
        self._closing: dict[str, str] = {}  # job -> reason: CloseSpider, closed at the ack
        self.jobs = Participation(
            queue,
            self.id,
            self.job_stats,
            crawler=crawler,
            holds=self.prefetch.holds,
            flush=self.flush,
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        compat.check_settings(settings, crawler.spidercls)
        client = connection.from_settings(settings)
        dupefilter = dupefilter_class(settings).from_crawler(crawler)
        queue = queue_class(settings)(
            client,
            dupefilter.keys,
            lease_seconds=setting(settings, "SCHEDULER_LEASE_SECONDS"),
            dedup=dupefilter.script,
            ack_replicas=setting(settings, "CELERY_CRAWL_ACK_REPLICAS"),
            ack_timeout=setting(settings, "CELERY_CRAWL_ACK_TIMEOUT"),
            deadletter_max=setting(settings, "SCHEDULER_DEADLETTER_MAX"),
            dedup_scope=setting(settings, "DUPEFILTER_SCOPE"),
            sites=SitePolicy.from_settings(settings),
        )
        return cls(
            queue,
            dupefilter,
            codec_from_settings(settings, crawler.spidercls),
            crawler=crawler,
            router=Router(queue, settings),
            group=[
                SpiderKeys.from_settings(spider, settings)
                for spider in group_members(queue.keys.spider, settings)
            ],
            persist=setting(settings, "SCHEDULER_PERSIST"),
            flush_on_start=setting(settings, "SCHEDULER_FLUSH_ON_START"),
            start_requests=setting(settings, "SCHEDULER_START_REQUESTS"),
            idle_before_close=setting(settings, "SCHEDULER_IDLE_BEFORE_CLOSE"),
            prefetch=setting(settings, "SCHEDULER_PREFETCH"),
            batch_size=setting(settings, "SCHEDULER_BATCH_SIZE"),
            requeue_interval=setting(settings, "SCHEDULER_REQUEUE_INTERVAL"),
            flush_delay=setting(settings, "SCHEDULER_FLUSH_DELAY"),
            allow_eviction=setting(settings, "CELERY_CRAWL_ALLOW_EVICTION"),
        )

    # -- lifecycle ---------------------------------------------------------

    def open(self, spider: Spider) -> None:
        self.spider = spider
        self._open = True
        connection.check(self.queue.client)
        connection.check_eviction(self.queue.client, self.allow_eviction)
        if self.flush_on_start:
            self.clear()
        opened = self.crawl.open(self.registration_seconds, fresh_stats=not self.persist)
        if self.queue.sites.enabled:
            SiteState(self.queue.client, self.queue.keys, self.queue.sites).publish_limits()
        self.df.open()
        # as after an out-of-memory spell: Redis may have refused its holders' renewals
        # until just now (this process may be opening because writes went through again),
        # so the leases that expired meanwhile are left to them for one lease time
        self._room_since = time.monotonic()
        if self.engine.engine is not None:
            self.engine.on_request_done(self.ack)
            self._start_maintenance()
            self.heartbeat.start()
            self._stop_listening = notices_of(self.queue.client).listen(
                self.queue.keys.signal, self._on_push
            )
            self.jobs.start()
            self.buffer.participant = self.id  # joins jobs now: late stats are judged by it
            self._share_start()
            self._hold_limits(opened)
        if self.crawler is not None:
            check_installed(self.crawler.settings)
            politeness.check_installed(self.crawler.settings)
            self.job_stats.connect(self.crawler.signals)
            self.crawler.signals.connect(self.close_job, signal=job_close)

    @property
    def starts_once(self) -> bool:
        """Whether one process of the crawl runs the start requests (``SCHEDULER_START_REQUESTS``).

        Not a :class:`~celery_crawl.spiders.RedisSpider`: its ``start()`` pops the
        start key, in every process, for as long as it runs.
        """
        return self.start_requests == "once" and not isinstance(self.spider, RedisMixin)

    def _share_start(self) -> None:
        """Run the spider's start output here only if this process claims it; else wait on it."""
        if self.starts_once:
            self.engine.wrap_start(lambda start: start_once(start, self.crawl, self.flush))

    def _hold_limits(self, opened: Opened) -> None:
        """``CLOSESPIDER_*`` for the whole crawl (``CLOSESPIDER_SCOPE``)."""
        if self.crawler is not None:
            self.limits = CrawlLimits.for_crawler(self.crawler, self.crawl)
        if self.limits is not None:
            self.limits.start(opened)

    def release_held(self) -> None:
        """Hand the prefetched leases back; a refusal (a damaged key) is repaired, tried
        once more, and otherwise left to the leases' expiry."""
        for attempt in (1, 2):
            try:
                self.queue.release(self.prefetch.held())
                return
            except redis.ResponseError as exc:
                if attempt == 2 or not self.repairer.after(exc):
                    logger.warning("leases not handed back (%s): they return when they expire", exc)
                    return

    def close(self, reason: str) -> None:
        self._open = False
        self._cancel_ready_call()
        if self._stop_listening is not None:
            self._stop_listening()
        if self._maintenance is not None and self._maintenance.running:
            self._maintenance.stop()
        self.heartbeat.stop()
        if self.limits is not None:
            self.limits.stop()
        self.flush()
        self.release_held()
        self.prefetch.clear()
        self.jobs.stop()
        leave = partial(self.queue.leave, self.id, clear=not self.persist)
        try:
            still_open, _ = retried(self.repairer, leave)  # a damaged key: repaired, sent again
        except redis.ResponseError as exc:  # refused twice: the registration lapses by itself
            logger.warning("scheduler not unregistered, Redis refused: %s", exc)
            return
        if still_open and not self.persist:
            logger.info(
                "queue and dedup filter kept: %d other process(es) still have them open; "
                "the last to close clears them (SCHEDULER_PERSIST is false)",
                still_open,
            )

    def close_job(self, response: Any, reason: str) -> None:
        """A callback of the job raised CloseSpider: the job ends ``closed``; the crawler stays.

        It ends once the engine is done with that response (:meth:`ack`), so
        that what the callback yielded before it raised is counted in the job.
        """
        self._closing[job_of(response)] = reason

    def _close_job(self, job: str, reason: str) -> None:
        try:
            self.flush()  # the job's counts first
            closed = self.queue.job_store.close(job, reason)
        except connection.TRANSIENT_ERRORS as exc:  # tried again at the job's next ack
            logger.warning("Redis unreachable, job %s not closed yet: %s", job, exc)
            self._closing[job] = reason
            return
        if closed:
            logger.info("job %s closed by its spider: %s", job, reason)

    def clear(self) -> None:
        """Forget the queue and the dedup filter (``SCHEDULER_FLUSH_ON_START``)."""
        retried(self.repairer, self.queue.clear)  # a damaged key: repaired, cleared once more
        self.df.clear()

    @property
    def maintenance_interval(self) -> float:
        return min(self.requeue_interval, self.queue.lease_seconds / 3)

    @property
    def registration_seconds(self) -> float:
        """How long this scheduler counts as open without a renewal (a killed process's expires)."""
        return max(3 * self.maintenance_interval, MIN_REGISTRATION_SECONDS)

    def _start_maintenance(self) -> None:
        from twisted.internet import task

        self._maintenance = task.LoopingCall(self.maintain)
        self._maintenance.start(self.maintenance_interval, now=False)

    def maintain(self) -> None:
        """In the reactor: write what the buffer holds, should no flush be due otherwise,
        and look for ended jobs whose notice was lost."""
        try:
            self.flush()
            self.jobs.check()
            self._end_lost_jobs()
        except connection.TRANSIENT_ERRORS as exc:
            logger.warning("Redis unreachable, scheduler maintenance will retry: %s", exc)
        except redis.ResponseError as exc:  # a damaged key: repaired, maintained next time
            self._refused(exc)
        except Exception:
            logger.exception("scheduler maintenance failed; will retry")

    def _end_lost_jobs(self) -> None:
        """Jobs whose requests Redis lost end ``incomplete``, twice a lease time after."""
        grace = 2 * self.queue.lease_seconds
        for job in end_lost_jobs(self.queue.client, self.group, grace, self.repairer):
            logger.error("job %s ended incomplete: requests of it were lost from Redis", job)

    def _refused(self, error: Exception) -> None:
        """Redis refused a script (a damaged key): counted, and the keys repaired.

        Out of memory is no damage: no repair, and no new lease until a write
        goes through again (:meth:`renew` tries one each beat)."""
        self._inc("celery_crawl/redis_errors")
        if isinstance(error, connection.OUT_OF_MEMORY):
            self._full(error)
        self.repairer.after(error)

    def _full(self, error: Exception) -> None:
        """Redis refused a write for memory: this process leases nothing more, keeps its leases."""
        if self.out_of_memory_since is None:
            self.out_of_memory_since = time.monotonic()
            self._inc("celery_crawl/redis_out_of_memory")
            logger.error(
                "Redis is out of memory (%s): %s keeps the %d requests it holds and leases no"
                " more until Redis takes writes again; free memory in Redis or raise maxmemory",
                error,
                self.queue.keys.spider,
                len(self.prefetch.held()),
            )

    def _room_again(self) -> None:
        """A write went through after Redis ran out of memory: leasing goes on."""
        if self.out_of_memory_since is not None:
            gone = time.monotonic() - self.out_of_memory_since
            spider = self.queue.keys.spider
            logger.warning("Redis takes writes again after %.0f s out of memory (%s)", gone, spider)
            self.out_of_memory_since = None
            self._room_since = time.monotonic()
            self._on_push()  # the engine asks for requests again now, not at its next heartbeat

    @property
    def requeue_due(self) -> bool:
        """No expired lease is requeued for a lease time after Redis was out of memory:
        their holders, who could not renew them meanwhile, renew them first."""
        if self.out_of_memory_since is not None:
            return False
        return time.monotonic() - self._room_since >= self.queue.lease_seconds

    def renew(self) -> None:
        """The heartbeat, in its own thread: renew this process's leases and registration,
        and requeue the leases that expired anywhere (their process stopped beating).

        A thread, not the reactor: a callback that holds the reactor longer than
        a lease must not let another process take the requests this one works on.
        While Redis is out of memory the renewals are refused (their leases are
        kept, see :attr:`requeue_due`), and a write that changes nothing
        (:meth:`~celery_crawl.queue.Base.check_room`) tells when it takes writes again.
        """
        try:
            self.queue.extend(self.prefetch.held())
            if self.out_of_memory_since is not None:
                self.queue.check_room()
            self.queue.join(self.id, self.registration_seconds)
            self._room_again()
            requeued = self.queue.requeue_expired() if self.requeue_due else 0
        except redis.ResponseError as exc:  # a damaged key: repaired, renewed next beat
            from twisted.internet import reactor

            # in the reactor: a repair here would hold up every other scheduler's beat
            reactor.callFromThread(self._refused, exc)
            return
        if requeued:
            logger.info("requeued %d requests whose lease expired", requeued)
            if self.stats is not None:
                from twisted.internet import reactor

                stats = self.stats
                reactor.callFromThread(stats.inc_value, "scheduler/requeued/expired", requeued)

    # -- enqueue -----------------------------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        assert self.spider is not None, "scheduler not open"
        try:  # refused when yielded, as it would be when read back (the codec's policy)
            self.codec.policy.check(request)
        except DecodeError as exc:
            return self.drop(request, exc.kind, exc)
        try:
            payload = self.codec.encode(request, self.spider)
            site = self.queue.sites.site_of(request)
        except (EncodeError, ConfigError) as exc:
            return self.drop(request, drop_kind(exc, "unserializable"), exc)
        target = target_of(request, self.spider.name)
        if target is not None:
            try:
                self._check_route(target)
            except ConfigError as exc:
                return self.drop(request, "unroutable", exc)
        fingerprint = None if request.dont_filter else self.df.fingerprint(request)
        job = job_of(request)
        if request.meta.get("retry_times"):
            self.job_stats.add(job, "retries")
        entry = Entry(payload, request.priority, fingerprint, job, site)
        self.buffer.add(Pending(request, entry, target))
        return True

    def _check_route(self, target: str) -> None:
        if self.router is None:
            raise ConfigError("this scheduler routes no requests to other spiders")
        self.router.queue(target)

    def drop(self, request: Request, kind: str, error: Exception) -> bool:
        """A request that cannot be queued: dead-lettered and counted at the next flush.

        The record and the job's count go in the same script call as the
        parent's ack (or before it), so the job cannot end without them.
        Returns False, for ``enqueue_request`` (the engine then sends
        ``request_dropped``).
        """
        job = job_of(request)
        self.buffer.dead_letter(self._record(kind, error, "enqueue", request=shown(request)))
        self.job_stats.add(job, "dropped")
        self.job_stats.add(job, f"errors/dropped/{kind}")
        self._inc(f"scheduler/dropped/{kind}")
        self._log_drop(kind, error)
        return False

    def _log_drop(self, kind: str, error: Exception) -> None:
        if kind in self._dropped_kinds:
            logger.debug("dropped a request that cannot be queued (%s): %s", kind, error)
            return
        self._dropped_kinds.add(kind)
        logger.error(
            "dropped a request that cannot be queued (%s): %s. To fix: %s. Each such request"
            " is kept in the dead-letter list %s and counted in its job (errors/dropped/%s)"
            " and in the stats (scheduler/dropped/%s); further drops of this kind are not logged",
            kind,
            error,
            NEXT_STEPS.get(kind, "see the error"),
            self.queue.keys.deadletter,
            kind,
            kind,
        )

    def _record(self, kind: str, error: Exception, stage: str, **what: Any) -> str:
        """A dead-letter record: why, where, when, and what can be shown of the request."""
        record = {
            "reason": kind,
            "error": str(error),
            "stage": stage,
            "spider": self.queue.keys.spider,
            "at": datetime.now(UTC).isoformat(),
            **what,
        }
        return json.dumps(record)

    def ack(self, request: Request) -> None:
        """The engine is done with ``request``: finish its lease at the next flush."""
        if self._closing and job_of(request) in self._closing:
            job = job_of(request)
            self._close_job(job, self._closing.pop(job))  # before this ack could end it done
        member = self.prefetch.finish(request)
        if member is not None:
            self.buffer.ack(member)
            self.jobs.request_done(job_of(request))

    def flush(self) -> None:
        """Write buffered requests, job stats and acks to Redis in one round trip."""
        self.buffer.flush()

    def _settle_items(self) -> None:
        """Before acks: the handlers of ``acks_due`` make the acked pages' items durable.

        The engine is done with a page only after its items went through the
        pipelines and ``item_scraped``, so what those handlers hold covers them.
        """
        if self.crawler is None:
            return
        for _, result in self.crawler.signals.send_catch_log(acks_due):
            if isinstance(result, Failure):
                result.raiseException()

    def _written(self, pushed: list[Pending], flags: list[bool]) -> None:
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
        if self.limits is not None and self.limits.reason is not None:
            return None  # the crawl reached a CLOSESPIDER_* limit: this process closes
        while (lease := self._next_lease()) is not None:
            try:
                job = lease.job
            except (ValueError, IndexError) as exc:  # the lease script lets none through
                self.dead_letter(lease, DecodeError("malformed", f"an unreadable lease: {exc}"))
                continue
            try:
                info = self.jobs.info(job) if job else JobInfo()
            except connection.TRANSIENT_ERRORS as exc:  # the lease waits for Redis
                logger.warning("Redis unreachable, job %s not joined: %s", lease.job, exc)
                self.prefetch.put_back(lease)
                return None
            except redis.ResponseError as exc:  # a damaged key: repaired, the lease waits
                self._refused(exc)
                self.prefetch.put_back(lease)
                return None
            if info is None:
                self._discard(lease)
                continue
            request = self._decode(lease)
            if request is not None:
                give_job_info(request, info)
                self.prefetch.hand_out(request, lease)
                self._inc("scheduler/dequeued/redis")
                self._inc("scheduler/dequeued")
                return request
        self._wait_for_work()
        return None

    def _next_lease(self) -> Lease | None:
        if self.out_of_memory_since is not None and not self.prefetch.waiting:
            return (
                None  # Redis would refuse it (queue/lua/include/room.lua); renew() sees room first
            )
        try:
            return self.prefetch.next()
        except connection.TRANSIENT_ERRORS as exc:
            logger.warning("Redis unreachable, no request leased: %s", exc)
            return None
        except redis.ResponseError as exc:  # a damaged key: repaired, leased again later
            self._refused(exc)
            return None

    def _lease(self, count: int) -> list[Lease]:
        self.buffer.flush()  # our own children first, so that they can be leased
        return self.queue.lease(count)

    def _discard(self, lease: Lease) -> None:
        """A request of a job that ended after it was leased: finished unprocessed."""
        self.job_stats.add(lease.job, "purged")
        self.buffer.ack(lease.member)
        self._inc("scheduler/discarded/job_ended")

    def _wait_for_work(self) -> None:
        """Nothing can be leased now: the engine is woken by a push, or when a parked site is due.

        A push by any process publishes on the queue's signal channel, which
        this process hears in its one notices thread (:mod:`celery_crawl.core.notices`):
        no thread and no Redis command per waiting scheduler. When a parked
        site is due sooner, a reactor timer wakes the engine then
        (:meth:`_wake_when_due`). Scrapy's own 5-second heartbeat asks again in
        any case.
        """
        if self._open and self.engine.engine is not None:
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

    def _on_push(self) -> None:
        """In the notices thread: work was pushed; one wake-up of the engine at a time."""
        if self._wake_pending or not self._open:
            return
        from twisted.internet import reactor

        self._wake_pending = True
        reactor.callFromThread(self._woken)

    def _woken(self) -> None:
        self._wake_pending = False
        if self._open:
            self.engine.wake()

    def _decode(self, lease: Lease) -> Request | None:
        assert self.spider is not None
        try:
            return self.codec.decode(lease.payload, self.spider)
        except DecodeError as exc:
            self.dead_letter(lease, exc)
        except Exception as exc:  # a codec bug or an input no check foresaw: never the engine's
            self.dead_letter(lease, DecodeError("malformed", f"{type(exc).__name__}: {exc}"))
        return None

    def dead_letter(self, lease: Lease, error: DecodeError) -> None:
        """Move an entry that cannot become a request out of the queue, with the reason.

        Record, job stat and the end of its lease are one script call (queue/lua/dead_letter.lua).
        """
        try:
            raw = lease.payload
        except (ValueError, IndexError):
            raw = lease.member[12:]
        entry = base64.b64encode(raw).decode("ascii")
        record = self._record(error.kind, error, "dequeue", entry=entry)
        try:
            self.queue.dead_letter(lease.member, record, error.kind)
        except connection.REFUSED_OR_TRANSIENT as exc:  # its lease expires: met again then
            logger.warning("entry not dead-lettered yet (%s): %s", error, exc)
            return
        logger.warning("dead-lettered a queue entry (%s): %s", error.kind, error)
        self._inc(f"celery_crawl/dead_letter/{error.kind}")

    def has_pending_requests(self) -> bool:
        """Work is pending while anything is queued, or leased by any process.

        A leased request may still yield children, so a process whose queue
        is momentarily empty keeps waiting while another holds leases. When
        both are zero, ``SCHEDULER_IDLE_BEFORE_CLOSE`` still applies.
        """
        if len(self.buffer) or self.prefetch.waiting:
            return True
        try:
            self.buffer.flush()  # this process's own acks first: its finished leases don't count
            queued, leased = self.queue.pending()
        except connection.TRANSIENT_ERRORS:
            return True  # cannot tell: stay open until Redis answers again
        except redis.ResponseError as exc:  # a damaged key: repaired; open until it can tell
            self.repairer.after(exc)
            return True
        if queued or leased:
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
        try:
            queued = len(self.queue)
        except redis.ResponseError as exc:  # a damaged key: repaired, counted next time
            self.repairer.after(exc)
            queued = 0
        return queued + len(self.buffer) + len(self.prefetch)

    def _inc(self, key: str, count: int = 1) -> None:
        if self.stats is not None and count:
            self.stats.inc_value(key, count)


def give_job_info(request: Request, info: JobInfo) -> None:
    """What every request of a job carries once leased: its spider arguments
    (``celery_crawl.job_args``) and its depth limit (``JobDepthMiddleware``)."""
    if info.args:
        request.meta[JOB_ARGS_META] = info.args
    if info.depth:
        request.meta[JOB_DEPTH_META] = info.depth


def drop_kind(error: Exception, default: str) -> str:
    """The short label of a drop, for stats keys and the dead-letter record."""
    return str(getattr(error, "kind", "") or default)


def shown(request: Request) -> dict[str, str | None]:
    """What a dead-letter record holds of a request that could not be queued: plain text only."""
    return {
        "url": request.url,
        "method": request.method,
        "callback": callback_name(request.callback),
        "errback": callback_name(request.errback),
        "job": job_of(request),
    }


def callback_name(func: Any) -> str | None:
    """What a dead-letter record can show of a callback: its name, never the object."""
    return None if func is None else str(getattr(func, "__name__", type(func).__name__))
