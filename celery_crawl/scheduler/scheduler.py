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
5. A process renews the leases it holds (prefetched, handed to the engine, or
   done and waiting for their ack's write) from a heartbeat thread
   (:mod:`celery_crawl.core.heartbeat`); leases whose process stopped beating
   expire (``SCHEDULER_LEASE_SECONDS``, 10 s) and are put back by any running
   scheduler's heartbeat; leases held at close are handed back at once.

A request that cannot be queued, and an entry that cannot become a request,
are dead-lettered (:mod:`celery_crawl.scheduler.dead_letters`). When nothing can
be leased the engine waits, and is woken when work may be there
(:mod:`celery_crawl.scheduler.wakeup`). A flush is run by name only: before
leasing (our own children first), before counting what is pending (our own
acks first), before a job is ended here or left, at close, and in the maintenance.

Several processes may share the queue. One has work pending while anything is
queued or leased anywhere (a leased request may still yield children), so a
process that starts early or late does not close while work is still coming.
Each open scheduler is registered in Redis, renewed by its heartbeat; with
``SCHEDULER_PERSIST`` false, only the last one to close clears the queue and
the dedup filter, in the same script that unregisters it.
"""

from __future__ import annotations

import logging
import time
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any, Self

import redis
from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from twisted.python.failure import Failure

from celery_crawl.codec.serializer import Codec, codec_from_settings
from celery_crawl.cookies.middleware import check_installed
from celery_crawl.core import compat, connection
from celery_crawl.core.entries import Lease
from celery_crawl.core.errors import ConfigError, DecodeError, EncodeError
from celery_crawl.core.heartbeat import Heartbeat
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.core.repair import Repairer, retried
from celery_crawl.dupefilter.filters import RFPDupeFilter
from celery_crawl.jobs.signals import JOB_ARGS_META, JOB_DEPTH_META, acks_due, job_end_asked, job_of
from celery_crawl.jobs.store import end_lost_jobs
from celery_crawl.politeness import middleware as politeness
from celery_crawl.politeness.sites import SiteState
from celery_crawl.queue.queues import Base
from celery_crawl.scheduler.buffer import Pending, WriteBehind, reactor_call_later
from celery_crawl.scheduler.components import Components
from celery_crawl.scheduler.config import SchedulerSettings
from celery_crawl.scheduler.crawl_limits import CrawlLimits
from celery_crawl.scheduler.crawl_state import Crawl, Opened, start_once
from celery_crawl.scheduler.dead_letters import DeadLetters, drop_kind
from celery_crawl.scheduler.engine import EngineHooks
from celery_crawl.scheduler.memory import OutOfMemory
from celery_crawl.scheduler.participation import JobInfo, Participation
from celery_crawl.scheduler.prefetch import Prefetch
from celery_crawl.scheduler.routing import Router, target_of
from celery_crawl.scheduler.wakeup import Wakeup

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class Scheduler(BaseScheduler):
    """``SCHEDULER = "celery_crawl.scheduler.Scheduler"``.

    Built by :meth:`from_crawler`: its queue and dedup filter, its router and
    group by the factory (:class:`~celery_crawl.scheduler.components.Components`),
    its own settings read once (:class:`~celery_crawl.scheduler.config.SchedulerSettings`).
    """

    def __init__(
        self,
        queue: Base,
        dupefilter: RFPDupeFilter,
        codec: Codec,
        *,
        crawler: Crawler | None = None,
        config: SchedulerSettings | None = None,
        router: Router | None = None,
        group: list[SpiderKeys] | None = None,
    ) -> None:
        self.queue, self.df, self.codec, self.router = queue, dupefilter, codec, router
        self.config = config or SchedulerSettings()
        self.crawler, self.stats = crawler, crawler.stats if crawler is not None else None
        self.group = group or [queue.keys]  # every spider's keys, for jobs whose work is lost
        self.repairer = Repairer(queue.client, queue.keys, self.group)  # routed ones: theirs too
        self.spider: Spider | None = None
        self.id = uuid.uuid4().hex  # this scheduler's registration among the open ones
        self.engine = EngineHooks(crawler)
        self.prefetch = Prefetch(queue.lease, self.config.prefetch)
        self.buffer = self._write_behind()
        self.job_stats = self.buffer.job_stats
        self.dead_letters = DeadLetters(queue, self.buffer, self.stats)
        self.wakeup = Wakeup(queue, self.engine)
        self.heartbeat = Heartbeat(
            f"leases of {queue.keys.spider}", self.renew, self.maintenance_interval
        )
        self.crawl = Crawl(queue.client, queue.keys, self.id)
        self.limits: CrawlLimits | None = None  # CLOSESPIDER_* for the whole crawl
        self.jobs = self._participation()
        self.memory = OutOfMemory(queue.keys.spider, queue.leases.longest, self.stats)
        self._empty_since: float | None = None
        self._maintenance: Any = None
        self._ending: dict[str, str] = {}  # job -> reason: CloseSpider, ended at the ack

    def _participation(self) -> Participation:
        return Participation(
            self.queue,
            self.id,
            self.job_stats,
            crawler=self.crawler,
            holds=self.prefetch.holds,
            flush=self.buffer.flush,
        )

    def _write_behind(self) -> WriteBehind:
        return WriteBehind(
            self.queue,
            self._written,
            router=self.router,
            call_later=reactor_call_later,
            on_error=self._refused,
            before_acks=self._settle_items,
            let_go=self.prefetch.let_go,
            delay=self.config.flush_delay,
            batch_size=self.config.batch_size,
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        compat.check_settings(settings, crawler.spidercls)
        components = Components.from_crawler(crawler)
        dupefilter = components.dupefilter(crawler.spidercls.name, crawler)
        queue = components.queue(dupefilter.keys, dedup=dupefilter.script)
        return cls(
            queue,
            dupefilter,
            codec_from_settings(settings, crawler.spidercls),
            crawler=crawler,
            config=SchedulerSettings.from_settings(settings),
            router=Router(queue, components),
            group=components.group(queue.keys.spider),
        )

    # -- lifecycle ---------------------------------------------------------

    def open(self, spider: Spider) -> None:
        self.spider = spider
        self.wakeup.open = True
        connection.check(self.queue.client)
        connection.check_eviction(self.queue.client, self.config.allow_eviction)
        if self.config.flush_on_start:
            self.clear()
        # a damaged key must not fail the opening (a hosted crawler's failing stops its worker)
        opened = retried(
            self.repairer,
            lambda: self.crawl.open(self.registration_seconds, fresh_stats=not self.config.persist),
            at_once=True,
        )
        if self.queue.sites.enabled:
            SiteState(self.queue.client, self.queue.keys, self.queue.sites).publish_limits()
        self.df.open()
        self.memory.opened()
        if self.engine.engine is not None:
            self.engine.ack_when_done(self.ack)
            self._start_maintenance()
            self.heartbeat.start()
            self.wakeup.listen()
            self.jobs.start()
            self.buffer.participant = self.id  # joins jobs now: late stats are judged by it
            self._share_start()
            self._hold_limits(opened)
        if self.crawler is not None:
            check_installed(self.crawler.settings)
            politeness.check_installed(self.crawler.settings)
            self.job_stats.connect(self.crawler.signals)
            self.crawler.signals.connect(self.end_job_after, signal=job_end_asked)

    @property
    def starts_once(self) -> bool:
        """Whether one process of the crawl runs the start requests (``SCHEDULER_START_REQUESTS``).

        Not for a spider whose class sets ``start_in_every_process``, as
        :class:`~celery_crawl.spiders.RedisSpider` does: its ``start()`` pops the start key,
        in every process, for as long as it runs.
        """
        every = getattr(type(self.spider), "start_in_every_process", False) is True
        return self.config.start_requests == "once" and not every

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
        """Hand back every lease still held (prefetched, handed to the engine, or with an
        ack not written); a refusal (a damaged key) is repaired, tried once more, and
        otherwise left to the leases' expiry."""
        for attempt in (1, 2):
            try:
                self.queue.release(self.prefetch.held())
                return
            except connection.TRANSIENT_ERRORS as exc:
                logger.warning("leases not handed back (%s): they return when they expire", exc)
                return
            except redis.ResponseError as exc:
                if attempt == 2 or not self.repairer.after(exc):
                    logger.warning("leases not handed back (%s): they return when they expire", exc)
                    return

    def close(self, reason: str) -> None:
        self.wakeup.stop()
        if self._maintenance is not None and self._maintenance.running:
            self._maintenance.stop()
        self.flush()  # while the heartbeat still renews the leases of the acks it writes
        self.heartbeat.stop()
        if self.limits is not None:
            self.limits.stop()
        self.release_held()
        self.prefetch.clear()
        self.job_stats.forget_held()  # fetched again, and counted then
        self.jobs.stop()
        unregister = partial(self.queue.unregister, self.id, clear=not self.config.persist)
        try:
            still_open, _ = retried(
                self.repairer, unregister
            )  # a damaged key: repaired, sent again
        except redis.ResponseError as exc:  # refused twice: the registration lapses by itself
            logger.warning("scheduler not unregistered, Redis refused: %s", exc)
            return
        except connection.TRANSIENT_ERRORS as exc:  # away: the registration lapses by itself
            logger.warning("scheduler not unregistered, Redis unreachable: %s", exc)
            return
        if still_open and not self.config.persist:
            logger.info(
                "queue and dedup filter kept: %d other process(es) still have them open; "
                "the last to close clears them (SCHEDULER_PERSIST is false)",
                still_open,
            )

    def end_job_after(self, response: Any, reason: str) -> None:
        """A callback of the job raised CloseSpider: the job ends ``closed``; the crawler stays.

        It ends once the engine is done with that response (:meth:`ack`), so
        that what the callback yielded before it raised is counted in the job.
        """
        self._ending[job_of(response)] = reason

    def clear(self) -> None:
        """Forget the queue and the dedup filter (``SCHEDULER_FLUSH_ON_START``)."""
        retried(self.repairer, self.queue.clear)  # a damaged key: repaired, cleared once more
        self.df.clear()

    @property
    def maintenance_interval(self) -> float:
        return self.config.maintenance_interval(self.queue.leases.shortest)

    @property
    def registration_seconds(self) -> float:
        """How long this scheduler counts as open without a renewal (a killed process's expires)."""
        return self.config.registration_seconds(self.queue.leases.shortest)

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
            connection.warn_away(
                logger, "Redis unreachable, scheduler maintenance will retry: %s", exc
            )
        except redis.ResponseError as exc:  # a damaged key: repaired, maintained next time
            self._refused(exc)
        except Exception:
            logger.exception("scheduler maintenance failed; will retry")

    def _end_lost_jobs(self) -> None:
        """Jobs whose requests Redis lost end ``incomplete``, twice the longest lease time after."""
        grace = 2 * self.queue.leases.longest
        for job in end_lost_jobs(self.queue.client, self.group, grace, self.repairer):
            logger.error("job %s ended incomplete: requests of it were lost from Redis", job)

    def _refused(self, error: Exception) -> None:
        """Redis refused a script (a damaged key): counted, and the keys repaired.

        Out of memory is no damage: no repair, and no new lease until a write
        goes through again (:meth:`renew` tries one each beat)."""
        self._inc("celery_crawl/redis_errors")
        if isinstance(error, connection.OUT_OF_MEMORY):
            self.memory.refused(error, len(self.prefetch.held()))
        self.repairer.after(error)

    def renew(self) -> None:
        """The heartbeat, in its own thread: renew this process's leases and registration,
        and requeue the leases that expired anywhere (their process stopped beating).

        A thread, not the reactor: a callback that holds the reactor longer than
        a lease must not let another process take the requests this one works on.
        While Redis is out of memory the renewals are refused (their leases are
        kept: :mod:`celery_crawl.scheduler.memory`), and a write that changes nothing
        (:meth:`~celery_crawl.queue.Base.check_room`) tells when it takes writes again.
        """
        try:
            self.queue.renew(self.prefetch.held())
            if self.memory.full:
                self.queue.check_room()
            self.queue.register(self.id, self.registration_seconds)
            if self.memory.room_again():
                self.wakeup.on_push()  # the engine asks again now, not at its next heartbeat
            requeued = self.queue.requeue_expired() if self.memory.requeue_due else 0
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
            return self.dead_letters.drop(request, exc.kind, exc)
        job = job_of(request)
        try:
            payload = self.codec.encode(request, self.spider)
            fingerprint = None if request.dont_filter else self.df.fingerprint(request)
            entry = self.queue.entry(request, payload, fingerprint, job)
        except (EncodeError, ConfigError) as exc:
            return self.dead_letters.drop(request, drop_kind(exc, "unserializable"), exc)
        target = target_of(request, self.spider.name)
        if target is not None:
            try:
                self._check_route(target)
            except ConfigError as exc:
                return self.dead_letters.drop(request, "unroutable", exc)
        if request.meta.get("retry_times"):
            self.job_stats.add(job, "retries")
        self.buffer.add(Pending(request, entry, target))
        return True

    def _check_route(self, target: str) -> None:
        if self.router is None:
            raise ConfigError("this scheduler routes no requests to other spiders")
        self.router.queue(target)

    def ack(self, request: Request) -> None:
        """The engine is done with ``request``: finish its lease at the next flush."""
        stats = self.job_stats.release(request)  # its page's stats: written with its ack
        job = job_of(request)
        member = self.prefetch.finish(request)
        if member is not None:
            self.buffer.ack(member, stats)
            self.jobs.request_done(job)
        reason = self._ending.pop(job, None) if self._ending else None
        if reason is not None:  # in this ack's call: after its stats count, before it acks
            self.buffer.end_job(job, reason)
            logger.info("job %s ends, as its spider asked: %s", job, reason)
            self.flush()

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
                self.dead_letters.dead_letter(
                    lease, DecodeError("malformed", f"an unreadable lease: {exc}")
                )
                continue
            try:
                info = self.jobs.info(job) if job else JobInfo()
            except connection.TRANSIENT_ERRORS as exc:  # the lease waits for Redis
                connection.warn_away(
                    logger, "Redis unreachable, job %s not joined: %s", lease.job, exc
                )
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
                self.job_stats.hold(request)  # its page's stats go with its ack
                self._inc("scheduler/dequeued/redis")
                self._inc("scheduler/dequeued")
                return request
        self.wakeup.wait_for_work()
        return None

    def _next_lease(self) -> Lease | None:
        if self.memory.full and not self.prefetch.waiting:
            return None  # Redis would refuse it (queue/lua/include/room.lua)
        try:
            if not self.prefetch.waiting:  # a lease is due: our own children first
                self.flush()
            return self.prefetch.next()
        except connection.TRANSIENT_ERRORS as exc:
            connection.warn_away(logger, "Redis unreachable, no request leased: %s", exc)
            return None
        except redis.ResponseError as exc:  # a damaged key: repaired, leased again later
            self._refused(exc)
            return None

    def _discard(self, lease: Lease) -> None:
        """A request of a job that ended after it was leased: finished unprocessed."""
        member = self.prefetch.finish_unhanded(lease)  # held until its ack is written
        self.buffer.ack(member, {(lease.job, "purged"): 1})
        self._inc("scheduler/discarded/job_ended")

    def _decode(self, lease: Lease) -> Request | None:
        assert self.spider is not None
        try:
            return self.codec.decode(lease.payload, self.spider)
        except DecodeError as exc:
            self.dead_letters.dead_letter(lease, exc)
        except Exception as exc:  # a codec bug or an input no check foresaw: never the engine's
            error = DecodeError("malformed", f"{type(exc).__name__}: {exc}")
            self.dead_letters.dead_letter(lease, error)
        return None

    def has_pending_requests(self) -> bool:
        """Work is pending while anything is queued, or leased by any process.

        A leased request may still yield children, so a process whose queue
        is momentarily empty keeps waiting while another holds leases. When
        both are zero, ``SCHEDULER_IDLE_BEFORE_CLOSE`` still applies. What this
        process buffered is written first (a flush): its own finished leases
        must not count as leased.
        """
        if len(self.buffer) or self.prefetch.waiting:
            return True
        self.flush()
        return self._pending_anywhere()

    def _pending_anywhere(self) -> bool:
        """Whether Redis holds queued or leased requests (or it cannot tell: then True)."""
        try:
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
        if self.config.idle_before_close <= 0:
            return False
        now = time.monotonic()
        if self._empty_since is None:
            self._empty_since = now
        return now - self._empty_since < self.config.idle_before_close

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
