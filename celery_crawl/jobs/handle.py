"""The handle on a job that application code gets back from ``crawl()``: :class:`Job`,
and :class:`JobStatus`, a job's progress read in one round trip.

The handle reads and changes the job through the job store
(:class:`celery_crawl.jobs.store.JobStore`); what it adds is waiting for the job's end,
riding out a Redis failover, and the job's Celery result.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from celery_crawl.core import connection
from celery_crawl.core.errors import JobTimeout, RedisOutOfMemory, UnknownJob, cut
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.jobs.limits import FIELD_PREFIX
from celery_crawl.jobs.store import ARGS_FIELD, COUNTERS, TERMINAL_STATES, JobStore

if TYPE_CHECKING:
    from celery_crawl.dupefilter.filters import DedupScript

logger = logging.getLogger(__name__)

# Job.wait rides out a Redis failover or restart this long (a Cluster fails over
# after its node timeout, 15 s by default, plus an election) before it gives up
WAIT_OUTAGE_SECONDS = 60.0
PROGRESS_CHARS = 1000  # of a job's progress in a JobTimeout message: its seeds may be long

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
    limits: dict[str, float] | None = None  # by name, as jobs.limits.LIMITS
    args: dict[str, str] | None = None  # spider arguments
    # stats that came after the job ended (a worker cut off, back late): kept apart
    late: dict[str, int] | None = None
    source: str = ""  # the source of the producer's schedule the job crawled; "" none
    # when the schedule made the source due, and when its tick reserved it (unix s); 0 none
    due_at: float = 0.0
    reserved_at: float = 0.0
    # browser counts (docs/browsers.md): rendered, render_needed, plain_enough
    browser: dict[str, int] | None = None

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
            "source": self.source,
            "due_at": self.due_at,
            "reserved_at": self.reserved_at,
            "browser": self.browser or {},
        }


def _time(value: str) -> float:
    """A time of a job's hash (unix s); 0 if it is absent or damaged."""
    try:
        return float(value)
    except ValueError:
        return 0.0


def _count(value: str) -> int:
    """A counter of a job's hash; 0 if it is damaged (core/lua/repair.lua then ends the job)."""
    try:
        return int(value)
    except ValueError:
        return 0


def parse_status(job_id: str, spider: str, raw: dict[bytes, bytes], read_at: float) -> JobStatus:
    """``read_at``: the server's clock (:func:`server_time`) when ``raw`` was read."""
    fields = {k.decode(): v.decode("utf-8", "replace") for k, v in raw.items()}
    counts = {name: _count(fields.get(name, "0")) for name in COUNTERS}
    prefixed = {
        name: _count(value)
        for name, value in fields.items()
        if name.startswith(("errors/", "status/", "browser/"))
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
        limits={
            k[len(FIELD_PREFIX) :]: float(v)
            for k, v in fields.items()
            if k.startswith(FIELD_PREFIX)
        },
        args=json.loads(fields.get(ARGS_FIELD, "{}")),
        late={k[5:]: _count(v) for k, v in fields.items() if k.startswith("late/")},
        source=fields.get("source", ""),
        due_at=_time(fields.get("due_at", "0")),
        reserved_at=_time(fields.get("reserved_at", "0")),
        browser={k[8:]: v for k, v in prefixed.items() if k.startswith("browser/")},
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
        self.store = JobStore(client, keys)

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

    def exists(self) -> bool:
        """Whether the job was started (and has not expired since)."""
        return self.store.exists(self.id)

    def status(self) -> JobStatus:
        """The job's progress, and the server's clock, in one round trip."""
        return self._parse(*self.store.read(self.id))

    def _parse(self, raw: dict[bytes, bytes], read_at: float) -> JobStatus:
        if not raw:
            raise UnknownJob(f"no job {self.id!r} for spider {self.spider!r}{self._evicted()}")
        return parse_status(self.id, self.spider, raw, read_at)

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
        """The job's status, and whether it has ended; if not, wait up to ``poll`` for its end.

        The status and the participants left are read in one round trip
        (``jobs/lua/job_settle.lua``).
        """
        participants, raw, read_at = self.store.settle(self.id)
        status = self._parse(raw, read_at)
        if status.finished and not participants:
            return status, True
        remaining = _left(deadline, poll)
        if remaining > 0:
            done_key = self.keys.job_done(self.id)
            self.client.blpop([done_key], timeout=max(min(remaining, poll), 0.01))
        return status, False

    def _ride_out(self, exc: Exception, began: float, deadline: float | None, poll: float) -> None:
        """Wait out a failover or a restart of Redis; raise ``exc`` once it lasts too long."""
        if time.monotonic() - began >= WAIT_OUTAGE_SECONDS or _left(deadline, poll) <= 0:
            raise exc
        connection.warn_away(logger, "job %s: Redis unreachable (%s); still waiting", self.id, exc)
        time.sleep(max(min(poll, _left(deadline, poll)), 0.01))

    def participants(self) -> int:
        """How many worker processes are still closing their part of the job.

        A process that died stops counting once the job has ended and the process's
        scheduler registration has lapsed (``jobs/lua/job_settle.lua``).
        """
        return self.store.participants(self.id)

    def close(self, reason: str) -> bool:
        """End the job now, ``closed`` with ``reason``; False if it had ended already.

        Unlike :meth:`cancel`, its queued requests are not purged at once: they
        are discarded when a lease reaches them.
        """
        return self.store.end(self.id, reason)

    def end_if_out_of_time(self) -> bool:
        """End the job ``closed`` (``closespider_timeout``) if its ``seconds`` limit has
        passed since it was created, on Redis's clock (``jobs/lua/job_timeout.lua``)."""
        return self.store.end_if_out_of_time(self.id)

    def cancel(self) -> int:
        """Stop the job and purge its queued requests; other jobs are untouched.

        Under the spider dedup scope, the purged requests' fingerprints leave
        the spiders' filters (unless their kind cannot forget one: bloom's keeps them),
        so that later jobs can crawl those URLs: the job's ``unfiltered`` field
        counts them. Returns how many requests were purged. A damaged key of any
        spider it spans is refused before anything is purged, repaired with its
        spider, and the call sent once more (:mod:`celery_crawl.core.repair`).
        """
        return self.store.cancel(self.id, self.spans, self.dedup)
