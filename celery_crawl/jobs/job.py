"""Crawl jobs: a set of seed requests and everything derived from them.

Every request of a job carries its id in ``request.meta[JOB_META]``. The job's
hash (``SpiderKeys.job``, layout in ``jobs/lua/include/jobs.lua``) counts its requests as
they are enqueued, leased and acked, inside the same scripts that move them,
so a job is done exactly when its last derived request has been processed.

:class:`JobStats` gathers per-job stats from Scrapy signals; the scheduler
writes them in the same script call as the acks, before the job can finish.
:class:`Job` is the handle application code gets back from ``crawl()``.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from celery_crawl.core import connection, scripts
from celery_crawl.core.errors import JobTimeout, RedisOutOfMemory, UnknownJob, cut
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.core.repair import Repairer, retried

if TYPE_CHECKING:
    from celery_crawl.dupefilter.filters import DedupScript

logger = logging.getLogger(__name__)

JOB_META = "celery_crawl_job"
JOB_PRIORITY_META = "celery_crawl_priority"
JOB_ARGS_META = "celery_crawl_args"  # the job's spider arguments, set when a request is leased
ARGS_FIELD = "args"  # the job hash field that holds them, as JSON
JOB_DEPTH_META = "celery_crawl_depth_limit"  # the job's depth limit, set when leased
# sent by the downloader middleware: a download of a job's request failed
job_error = object()
# sent by the spider middleware once per callback: how many items it yielded
job_items = object()

# sent by the spider middleware: a callback of a job's response raised CloseSpider
job_close = object()

# sent by the scheduler just before it acks the leases of finished pages (once per
# write, not per page): a handler holding their items in memory hands them to the OS
# (celery_crawl.hosting.feeds); one that raises keeps those acks from being sent
acks_due = object()

# Public signals, sent in each worker process that worked on a job
# (celery_crawl.scheduler.participation), with the job id and spider as arguments:
# job_opened(job_id, spider), before the process's first request of the job;
# job_finished(job_id, stats, spider), once the job has ended and every item
# this process scraped for it went through the pipelines (and their close_job).
job_opened = object()
job_finished = object()

# incomplete: pages were fetched, but requests of the job could not be queued (dropped)
# closed: a limit was reached, or a callback raised CloseSpider (field reason)
TERMINAL_STATES = ("done", "incomplete", "failed", "cancelled", "closed")
# Job.wait rides out a Redis failover or restart this long (a Cluster fails over
# after its node timeout, 15 s by default, plus an election) before it gives up
WAIT_OUTAGE_SECONDS = 60.0
PROGRESS_CHARS = 1000  # of a job's progress in a JobTimeout message: its seeds may be long
# a job's limits, with Scrapy's meaning: name -> (CloseSpider setting, reason when reached)
LIMITS = {
    "pages": ("CLOSESPIDER_PAGECOUNT", "closespider_pagecount"),
    "items": ("CLOSESPIDER_ITEMCOUNT", "closespider_itemcount"),
    "seconds": ("CLOSESPIDER_TIMEOUT", "closespider_timeout"),
    "errors": ("CLOSESPIDER_ERRORCOUNT", "closespider_errorcount"),
    # not a reason to close: requests deeper than this are not followed (DEPTH_LIMIT)
    "depth": ("DEPTH_LIMIT", ""),
}
_COUNTERS = (
    "pending",
    "leased",
    "done",
    "pages",
    "items",
    "retries",
    "duplicates",
    "purged",
    "dropped",
)


def job_of(obj: Any) -> str:
    """The job id carried by a request or response, or ``""``."""
    meta = getattr(obj, "meta", None) or {}
    return str(meta.get(JOB_META) or "")


def job_args(obj: Any) -> dict[str, str]:
    """The spider arguments of the job of a response or request (``crawl(..., args=...)``).

    What ``scrapy crawl -a NAME=VALUE`` gives a spider, for one job: a hosted
    spider serves every job, so its attributes cannot hold them. Every request
    of the job has them once leased, children included. ``{}`` outside a job.
    """
    meta = getattr(obj, "meta", None) or {}
    return dict(meta.get(JOB_ARGS_META) or {})


# the job of each item on its way through the pipelines: id(item) -> job
_item_jobs: OrderedDict[int, str] = OrderedDict()
MAX_ITEMS_TRACKED = 100_000  # items in the pipelines at once; the oldest are forgotten beyond


def item_job(item: Any) -> str:
    """The job whose callback yielded ``item``, for item pipelines; ``""`` outside a job.

    Known from the moment the callback yields the item until it leaves the
    pipelines (scraped, dropped or failed). A pipeline that returns a new
    object instead of the item passes its job on with :func:`set_item_job`.
    """
    return _item_jobs.get(id(item), "")


def set_item_job(item: Any, job: str) -> None:
    """Record the job of an item (done by ``JobSpiderMiddleware`` for every item)."""
    if job:
        _item_jobs[id(item)] = job
        if len(_item_jobs) > MAX_ITEMS_TRACKED:
            _item_jobs.popitem(last=False)


def forget_item(item: Any, **_: Any) -> None:
    """The item left the pipelines: connected to item_scraped, item_dropped, item_error."""
    _item_jobs.pop(id(item), None)


class JobStats:
    """Per-job stat changes, buffered until the scheduler's next flush."""

    def __init__(self) -> None:
        self._deltas: Counter[tuple[str, str]] = Counter()

    def add(self, job: str, field: str, delta: int = 1) -> None:
        if job:
            self._deltas[(job, field)] += delta

    def drain(self) -> list[tuple[str, str, int]]:
        deltas = [(job, field, n) for (job, field), n in self._deltas.items() if n]
        self._deltas.clear()
        return deltas

    def connect(self, signals_manager: Any) -> None:
        from scrapy import signals

        signals_manager.connect(self.on_response, signal=signals.response_received)
        signals_manager.connect(self.on_items, signal=job_items)
        signals_manager.connect(self.on_item_dropped, signal=signals.item_dropped)
        signals_manager.connect(self.on_item_error, signal=signals.item_error)
        signals_manager.connect(self.on_spider_error, signal=signals.spider_error)
        signals_manager.connect(self.on_job_error, signal=job_error)

    def on_response(self, response: Any, request: Any, spider: Any) -> None:
        job = job_of(request)
        self.add(job, "pages")
        self.add(job, f"status/{response.status}")

    def on_items(self, response: Any, count: int) -> None:
        # counted once per callback, not per item: a signal per item costs a task each
        self.add(job_of(response), "items", count)

    def on_item_dropped(self, item: Any, response: Any, exception: Any, spider: Any) -> None:
        self.add(job_of(response), "items", -1)
        self.add(job_of(response), "items_dropped")

    def on_item_error(self, item: Any, response: Any, spider: Any, failure: Any) -> None:
        self.add(job_of(response), "items", -1)
        self.add(job_of(response), f"errors/item/{failure.type.__name__}")

    def on_spider_error(self, failure: Any, response: Any, spider: Any) -> None:
        self.add(job_of(response), f"errors/{failure.type.__name__}")
        self.add(job_of(response), "errors")  # CLOSESPIDER_ERRORCOUNT's count: callback errors

    def on_job_error(self, request: Any, kind: str) -> None:
        self.add(job_of(request), f"errors/{kind}")


def limit_fields(limits: dict[str, float]) -> dict[str, str]:
    """The job hash fields of ``limits`` (pages, items, seconds); 0 or None means no limit."""
    unknown = set(limits) - set(LIMITS)
    if unknown:
        raise ValueError(f"unknown job limits {sorted(unknown)}: use {', '.join(LIMITS)}")
    return {f"limit/{name}": format(float(value), "g") for name, value in limits.items() if value}


# the AsyncResults Job.result handed out, until they are freed
_handed_out: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _left(deadline: float | None, poll: float) -> float:
    """Seconds left before ``deadline``; ``poll`` when there is none."""
    return poll if deadline is None else deadline - time.monotonic()


@functools.cache
def _release_at_exit() -> None:
    atexit.register(release_results)


def release_results() -> None:
    """At exit: stop waiting on the backend for results handed out and still alive.

    Celery's result backend keeps every result whose ``get()`` timed out, and
    only its ``__del__`` stops waiting on it: at interpreter shutdown, when
    the unsubscribe can no longer connect and prints a traceback. Done here,
    while the interpreter still works, the later ``__del__`` has nothing left to do.
    """
    for result in list(_handed_out.values()):
        result.backend.remove_pending_result(result)
    _handed_out.clear()


@dataclass(frozen=True)
class JobStatus:
    """A job's live progress, read in one round trip."""

    job_id: str
    spider: str
    state: str
    queued: int
    in_flight: int
    done: int
    pages: int
    items: int
    retries: int
    dropped: int  # requests that could not be queued: in the dead-letter list
    errors: dict[str, int]
    status_codes: dict[str, int]
    seeds: list[Any]
    created_at: float
    finished_at: float | None
    read_at: float  # the server's clock when the job was read: a running job's duration ends here
    reason: str = ""  # why a closed job was closed
    limits: dict[str, float] | None = None  # pages, items, seconds
    args: dict[str, str] | None = None  # spider arguments
    # stats that came after the job ended (a worker cut off, back late): kept apart
    late: dict[str, int] | None = None

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def duration(self) -> float:
        """Seconds from its creation to its end, or to when it was read: on Redis's clock."""
        end = self.finished_at if self.finished_at is not None else self.read_at
        return round(max(end - self.created_at, 0.0), 3)

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "spider": self.spider,
            "state": self.state,
            "queued": self.queued,
            "in_flight": self.in_flight,
            "done": self.done,
            "pages": self.pages,
            "items": self.items,
            "retries": self.retries,
            "dropped": self.dropped,
            "errors": self.errors,
            "status_codes": self.status_codes,
            "seeds": self.seeds,
            "duration": self.duration,
            "reason": self.reason,
            "limits": self.limits or {},
            "args": self.args or {},
            "late": self.late or {},
        }


def end_lost_jobs(
    client: redis.Redis,
    group: Sequence[SpiderKeys],
    grace_seconds: float,
    repairer: Repairer | None = None,
) -> list[str]:
    """End the group's jobs whose requests are gone from Redis: ``incomplete``, with
    ``errors/lost`` (``jobs/lua/job_reconcile.lua``). One script call; the ids it ended.

    Refused for a damaged key (nothing written), the key is repaired with the spider
    of the group it is of, and the call sent once more (:mod:`celery_crawl.core.repair`):
    by ``repairer``, a scheduler's own, so its once-per-``REPAIR_SECONDS`` holds.
    """
    repairer = repairer or Repairer(client, group[0], group)
    keys = [group[0].job_prefix]
    for spider in group:
        keys += [spider.queue, spider.parked, spider.inflight]
    reconcile = scripts.script(client, "job_reconcile")
    args = [int(grace_seconds * 1000)]
    ended = retried(repairer, lambda: reconcile(keys=keys, args=args))
    return [job.decode() if isinstance(job, bytes) else job for job in ended]


def _count(value: str) -> int:
    """A counter of a job's hash; 0 if it is damaged (core/lua/repair.lua then ends the job)."""
    try:
        return int(value)
    except ValueError:
        return 0


def server_time(reply: Sequence[int | bytes | str]) -> float:
    """Seconds since the epoch from the reply of Redis's ``TIME`` (as a script returns it, too)."""
    seconds, micros = reply
    return int(seconds) + int(micros) / 1_000_000


def parse_status(job_id: str, spider: str, raw: dict[bytes, bytes], read_at: float) -> JobStatus:
    """``read_at``: the server's clock (:func:`server_time`) when ``raw`` was read."""
    fields = {k.decode(): v.decode("utf-8", "replace") for k, v in raw.items()}
    counts = {name: _count(fields.get(name, "0")) for name in _COUNTERS}
    prefixed = {
        name: _count(value)
        for name, value in fields.items()
        if name.startswith(("errors/", "status/"))
    }
    return JobStatus(
        job_id=job_id,
        spider=fields.get("spider", spider),
        state=fields.get("state", "unknown"),
        queued=max(counts["pending"] - counts["leased"], 0),
        in_flight=counts["leased"],
        done=counts["done"],
        pages=counts["pages"],
        items=counts["items"],
        retries=counts["retries"],
        dropped=counts["dropped"],
        errors={k[7:]: v for k, v in prefixed.items() if k.startswith("errors/")},
        status_codes={k[7:]: v for k, v in prefixed.items() if k.startswith("status/")},
        seeds=json.loads(fields.get("seeds", "[]")),
        created_at=float(fields.get("created_at", 0)),
        finished_at=float(fields["finished_at"]) if "finished_at" in fields else None,
        read_at=read_at,
        reason=fields.get("reason", ""),
        limits={k[6:]: float(v) for k, v in fields.items() if k.startswith("limit/")},
        args=json.loads(fields.get(ARGS_FIELD, "{}")),
        late={k[5:]: _count(v) for k, v in fields.items() if k.startswith("late/")},
    )


class Job:
    """A handle on a running or finished job."""

    def __init__(
        self,
        job_id: str,
        spider: str,
        client: redis.Redis,
        keys: SpiderKeys,
        spans: Sequence[SpiderKeys] = (),
        *,
        app: Any = None,
        dedup: DedupScript | None = None,
    ) -> None:
        self.id = job_id
        self.spider = spider
        self.client = client
        self.keys = keys
        self.spans = list(spans) or [keys]  # the spiders (of its group) the job may span
        self.app = app
        self.dedup = dedup  # the spiders' filter kind: cancel() takes fingerprints out of it

    @property
    def result(self) -> Any:
        """The job's Celery ``AsyncResult`` (the task id is the job id).

        Results handed out here stop waiting on the result backend at exit
        (:func:`release_results`), so a script that ends after ``crawl()``
        prints no traceback.
        """
        if self.app is None:
            raise AttributeError(f"{self!r} was made without its Celery app: no task result")
        result = self.app.AsyncResult(self.id)
        _release_at_exit()
        _handed_out[id(result)] = result
        return result

    def __repr__(self) -> str:
        return f"<Job {self.id} spider={self.spider!r}>"

    def status(self) -> JobStatus:
        """The job's progress, and the server's clock, in one round trip."""
        key = self.keys.job(self.id)
        try:
            flat, now = scripts.script(self.client, "job_read")(keys=[key])
        except redis.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            raise UnknownJob(f"job {self.id!r}: its key {key} is damaged (not a hash)") from exc
        if not flat:
            raise UnknownJob(f"no job {self.id!r} for spider {self.spider!r}{self._evicted()}")
        raw = dict(zip(flat[::2], flat[1::2], strict=True))
        return parse_status(self.id, self.spider, raw, server_time(now))

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> dict[str, Any]:
        """Block until the job has ended; return its statistics.

        ``state`` says how it ended: ``done``, ``incomplete`` (``dropped``
        requests could not be queued: see the dead-letter list), ``failed``
        (not one page, and errors), ``cancelled`` or ``closed``.

        It returns once every worker process that worked on the job has
        closed its part: items through the pipelines and their ``close_job``,
        ``%(job)s`` feeds stored, ``job_finished`` sent
        (:mod:`celery_crawl.scheduler.participation`).

        A failover or restart of Redis is waited out, with a warning logged,
        for up to :data:`WAIT_OUTAGE_SECONDS` and within ``timeout``; then the
        connection error is raised (one of ``connection.TRANSIENT_ERRORS``).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        outage_began: float | None = None
        while True:
            try:
                status, ended = self._look(deadline, poll)
            except connection.TRANSIENT_ERRORS as exc:
                outage_began = outage_began or time.monotonic()
                self._ride_out(exc, outage_began, deadline, poll)
                continue
            outage_began = None
            if ended:
                return status.as_dict()
            if _left(deadline, poll) <= 0:
                progress = cut(str(status.as_dict()), PROGRESS_CHARS)
                self._raise_if_full(f"job {self.id} not done after {timeout} s")
                raise JobTimeout(f"job {self.id} not done after {timeout} s: {progress}")

    def _raise_if_full(self, text: str) -> None:
        """Raise :class:`RedisOutOfMemory` if Redis is at its ``maxmemory`` now."""
        memory = connection.memory(self.client)
        if memory is not None and memory.out_of_memory:
            raise RedisOutOfMemory(f"{text}: {memory.describe()}")

    def evictions(self) -> str:
        """ "Redis evicted N keys (maxmemory-policy P)" if it has (an evicting policy), or ""."""
        try:
            memory = connection.memory(self.client)
        except redis.RedisError:
            return ""
        if memory is None or not memory.evicted_keys:
            return ""
        return f"Redis evicted {memory.evicted_keys} keys (maxmemory-policy {memory.policy})"

    def _evicted(self) -> str:
        """Why a job's hash may be gone: Redis evicted keys."""
        evicted = self.evictions()
        return f": {evicted}, its hash may be among them" if evicted else ""

    def _look(self, deadline: float | None, poll: float) -> tuple[JobStatus, bool]:
        """The job's status, and whether it has ended; if not, wait up to ``poll`` for its end."""
        status = self.status()
        if status.finished and not self.participants():
            return status, True
        remaining = _left(deadline, poll)
        if remaining > 0:
            done_key = self.keys.job(self.id) + ":done"
            self.client.blpop([done_key], timeout=max(min(remaining, poll), 0.01))
        return status, False

    def _ride_out(self, exc: Exception, began: float, deadline: float | None, poll: float) -> None:
        """Wait out a failover or a restart of Redis; raise ``exc`` once it lasts too long."""
        if time.monotonic() - began >= WAIT_OUTAGE_SECONDS or _left(deadline, poll) <= 0:
            raise exc
        logger.warning("job %s: Redis unreachable (%s); still waiting", self.id, exc)
        time.sleep(max(min(poll, _left(deadline, poll)), 0.01))

    def participants(self) -> int:
        """How many worker processes are still closing their part of the job.

        A process that died is no longer counted once its scheduler
        registration lapses (``jobs/lua/job_settle.lua``).
        """
        settle = scripts.script(self.client, "job_settle")
        return int(settle(keys=[self.keys.job_prefix], args=[self.id]))

    def close(self, reason: str) -> bool:
        """End the job now, ``closed`` with ``reason``; False if it had ended already.

        Unlike :meth:`cancel`, its queued requests are not purged at once: they
        are discarded when a lease reaches them.
        """
        close = scripts.script(self.client, "job_close")
        return bool(close(keys=[self.keys.job_prefix], args=[self.id, reason]))

    def close_if_out_of_time(self) -> bool:
        """End the job ``closed`` (``closespider_timeout``) if its ``seconds`` limit has
        passed since it was created, on Redis's clock (``jobs/lua/job_timeout.lua``)."""
        timeout = scripts.script(self.client, "job_timeout")
        return bool(timeout(keys=[self.keys.job_prefix], args=[self.id, LIMITS["seconds"][1]]))

    def cancel(self) -> int:
        """Stop the job and purge its queued requests; other jobs are untouched.

        Under the spider dedup scope, the purged requests' fingerprints leave
        the spiders' filters (exact and expiring; a bloom filter keeps them),
        so that later jobs can crawl those URLs: the job's ``unfiltered`` field
        counts them. Returns how many requests were purged. A damaged key of any
        spider it spans is refused before anything is purged, repaired with its
        spider, and the call sent once more (:mod:`celery_crawl.core.repair`).
        """
        lua, params = (self.dedup.lua, self.dedup.params) if self.dedup else ("dedup_exact", ())
        keys = [self.keys.job_prefix]
        for span in self.spans:
            keys += [span.queue, span.dupefilter, span.dupefilter_count]
        cancel = scripts.script(self.client, "job_cancel", dupefilter=lua)
        repairer = Repairer(self.client, self.keys, self.spans)
        return int(retried(repairer, lambda: cancel(keys=keys, args=[self.id, *params])))
