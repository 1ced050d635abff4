"""A worker process's part in the jobs it works on: join, run, leave.

Hosted crawlers serve every job of their spider, so Scrapy's per-crawl hooks
(``open_spider``, ``close_spider``, ``spider_closed``, feeds) run only when a
worker starts and stops. :class:`Participation` gives each job the same
moments, in every process that works on it:

1. **Join.** At the first request of a job that this process hands to its
   engine, it joins the job's participants and reads the job's spider
   arguments and depth limit, in one script call (``jobs/lua/job_join.lua``).
   Item pipelines' ``open_job(job_id)`` run, and the ``job_opened`` signal is sent.
2. **End.** When the job ends (done, incomplete, failed, cancelled, closed),
   the script that ends it pushes its id onto every participant's list
   (``jobs/lua/include/jobs.lua``); a thread of each process waits on its own.
   Should a notice be lost (Redis restarted), the scheduler's maintenance
   finds the end anyway, from the states of the jobs joined (:meth:`Participation.check`).
3. **Leave.** Once the process holds no more leases of the job (its last
   responses went through their callbacks, and their items through the
   pipelines), pipelines' ``close_job(job_id, stats)`` run, then the
   ``job_finished(job_id, stats, spider)`` signal is sent (``%(job)s`` feeds
   are stored on it: :mod:`celery_crawl.hosting.feeds`), then the process leaves the
   job (``jobs/lua/job_leave.lua``).

:meth:`celery_crawl.jobs.handle.Job.wait` returns once the job has ended and no
participant is left, so its feed files are complete and closed by then. A
process that dies without leaving stops counting when its scheduler
registration lapses (30 s).

A request of a job that has ended, leased before it ended and not yet handed
to the engine, is discarded (acked unprocessed), as the lease script discards
the ones still queued.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.utils.defer import deferred_from_coro, ensure_awaitable, maybe_deferred_to_future

from celery_crawl.core import connection
from celery_crawl.core.notices import notices_of
from celery_crawl.jobs import logcontext
from celery_crawl.jobs.handle import Job
from celery_crawl.jobs.signals import job_finished, job_opened
from celery_crawl.jobs.stats import JobStats
from celery_crawl.scheduler.buffer import reactor_call_later
from celery_crawl.scheduler.engine import EngineHooks

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from celery_crawl.queue.queues import Base

logger = logging.getLogger(__name__)
MAX_JOBS_KEPT = 4096  # jobs a process remembers having left
RETRY_SECONDS = 1.0  # leaving a job again, after Redis was away
MAX_ENDED_TAKEN = 1000  # job ids taken off the list of ended jobs per notice


@dataclass(frozen=True)
class JobInfo:
    """What a process needs to run a job's requests."""

    args: dict[str, str] = field(default_factory=dict)
    depth: int = 0  # deepest request followed; 0: no limit


class Participation:
    """The jobs this process (one scheduler) works on."""

    def __init__(
        self,
        queue: Base,
        scheduler_id: str,
        job_stats: JobStats,
        *,
        crawler: Crawler | None = None,
        holds: Callable[[str], bool] = lambda job: False,
        flush: Callable[[], None] = lambda: None,
    ) -> None:
        self.queue = queue
        self.id = scheduler_id
        self.job_stats = job_stats
        self.crawler = crawler
        self.holds = holds  # whether this process still holds a lease of the job
        self.flush = flush  # writes this process's acks and job stats
        self.joined: dict[str, JobInfo] = {}
        self.ending: set[str] = set()  # ended, not left yet
        self.leaving: set[str] = set()
        self.done: OrderedDict[str, None] = OrderedDict()  # ended here: requests discarded
        self._opening: dict[str, list[Any]] = {}  # job -> open_job awaitables
        self._hooks_run: set[str] = set()  # leaving: close_job and job_finished done
        self._stop_listening: Callable[[], None] | None = None

    # -- join ---------------------------------------------------------------

    def info(self, job: str) -> JobInfo | None:
        """The job's info, joining the job at its first request here; None: the job has ended.

        May raise a transient Redis error: the caller keeps the lease and asks again.
        """
        if job in self.ending or job in self.done:
            return None
        found = self.joined.get(job)
        if found is not None:
            return found
        state, args, depth = self.queue.job_store.join(job, self.id if self.listening else "")
        if state != "running":
            self._remember_done(job)
            return None
        info = self.joined[job] = JobInfo(json.loads(args) if args else {}, int(float(depth or 0)))
        if self.listening:
            self._open(job)
        return info

    def _open(self, job: str) -> None:
        for pipeline in self._pipelines():
            hook = getattr(pipeline, "open_job", None)
            if hook is not None:
                self._call(job, "open_job", hook, job, pending=self._opening.setdefault(job, []))
        if self.crawler is not None:
            spider = self._spider()
            self.crawler.signals.send_catch_log(job_opened, job_id=job, spider=spider)

    # -- end ----------------------------------------------------------------

    @property
    def listening(self) -> bool:
        """Whether this process hears of the jobs' ends: a scheduler driven by hand
        (no engine, no reactor) reads job info without joining."""
        return self._stop_listening is not None

    def start(self) -> None:
        """Hear of the ends of the jobs joined here, in the process's notices thread."""
        channel = self.queue.keys.job_ended(self.id)
        self._stop_listening = notices_of(self.queue.client).listen(channel, self._drain_ended)

    def stop(self) -> None:
        """At close: stop listening, and leave every job this process joined."""
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None
        for job in list(self.joined):
            try:
                self.queue.job_store.leave(job, self.id)
            except connection.REFUSED_OR_TRANSIENT as exc:  # its registration lapses instead
                logger.warning("job %s not left (%s): its registration lapses instead", job, exc)
        self.joined.clear()

    def _drain_ended(self) -> None:
        """In the notices thread: take every job id off this scheduler's list of ended jobs."""
        from twisted.internet import reactor

        for job in self.queue.job_store.take_ended(self.id, MAX_ENDED_TAKEN):
            reactor.callFromThread(self.ended, job)

    def ended(self, job: str) -> None:
        """In the reactor: ``job`` ended; this process leaves it once it holds none of it."""
        if job not in self.joined:
            return
        self.ending.add(job)
        self.request_done(job)

    def request_done(self, job: str) -> None:
        """The engine is done with a request of ``job``: was it the last one held here?"""
        if job in self.ending and job not in self.leaving and not self.holds(job):
            self.leaving.add(job)
            deferred_from_coro(self.leave(job))

    async def leave(self, job: str) -> None:
        """Leave an ended job: write what is buffered (the acks of its last pages here
        carry their stats), run the hooks with the job's stats, write what they left,
        then leave (``jobs/lua/job_leave.lua``); tried again while Redis is away.

        The hooks run once: a retry only writes what is buffered and leaves.
        """
        logcontext.enter(self.crawler.spidercls.name if self.crawler else "", job)
        try:
            if job not in self._hooks_run:
                self.flush()  # the acks of its last pages here, which carry their stats
                stats = Job(job, "", self.queue.client, self.queue.keys).status().as_dict()
                await self._run_hooks(job, stats)
                self._hooks_run.add(job)
            self.flush()
            self.queue.job_store.leave(job, self.id)
        except connection.TRANSIENT_ERRORS as exc:
            logger.warning("Redis unreachable, job %s not left yet: %s", job, exc)
            self._retry(job)
            return
        except Exception:  # never into the reactor: the job's participants expire instead
            logger.exception("leaving job %s failed", job)
        self.joined.pop(job, None)
        self.ending.discard(job)
        self.leaving.discard(job)
        self._hooks_run.discard(job)
        self._remember_done(job)

    async def _run_hooks(self, job: str, stats: dict[str, Any]) -> None:
        """Pipelines' close_job, then the job_finished signal (feeds are stored on it)."""
        await self._wait_opened(job)
        for pipeline in reversed(self._pipelines()):
            hook = getattr(pipeline, "close_job", None)
            if hook is not None:
                await self._await(job, "close_job", hook, job, stats)
        if self.crawler is not None:
            spider = self._spider()
            await self.crawler.signals.send_catch_log_async(
                job_finished, job_id=job, stats=stats, spider=spider
            )

    def check(self) -> None:
        """In the reactor, now and then: notice an end whose notice was lost (Redis restarted).

        The list of ended jobs is the fast way; this is the sure one: one
        pipelined read of the state of each job joined here and still running.
        """
        running = [job for job in self.joined if job not in self.ending]
        if not running:
            return
        for job in self.queue.job_store.ended(running):
            self.ended(job)

    def _retry(self, job: str) -> None:
        self.leaving.discard(job)
        reactor_call_later(RETRY_SECONDS, lambda: self.request_done(job))

    def _remember_done(self, job: str) -> None:
        self.done[job] = None
        while len(self.done) > MAX_JOBS_KEPT:
            self.done.popitem(last=False)

    def _spider(self) -> Any:
        try:
            return self.crawler.spider if self.crawler is not None else None
        except RuntimeError:  # Crawler.spider before the crawl started
            return None

    # -- the pipelines' hooks ------------------------------------------------

    def _pipelines(self) -> list[Any]:
        return EngineHooks(self.crawler).pipelines()

    def _call(self, job: str, name: str, hook: Any, *args: Any, pending: list[Any]) -> None:
        """Call a pipeline's hook; an awaitable it returns is awaited before the job is left."""
        try:
            result = hook(*args)
        except Exception as exc:
            self._failed(job, name, hook, exc)
            return
        if inspect.isawaitable(result):  # started now, awaited before the job is left
            pending.append((name, hook, deferred_from_coro(result)))

    async def _await(self, job: str, name: str, hook: Any, *args: Any) -> None:
        try:
            await ensure_awaitable(hook(*args))
        except Exception as exc:
            self._failed(job, name, hook, exc)

    async def _wait_opened(self, job: str) -> None:
        for name, hook, started in self._opening.pop(job, []):
            try:
                await maybe_deferred_to_future(started)
            except Exception as exc:
                self._failed(job, name, hook, exc)

    def _failed(self, job: str, name: str, hook: Any, exc: Exception) -> None:
        """A pipeline's hook raised: logged, and counted in the job's stats; the job goes on."""
        owner = type(getattr(hook, "__self__", hook)).__name__
        logger.error("%s.%s(%r) failed", owner, name, job, exc_info=exc)
        self.job_stats.add(job, f"errors/{name}/{type(exc).__name__}")
