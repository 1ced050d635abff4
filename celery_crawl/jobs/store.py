"""The job store: every script that reads or changes a job, and the job's state machine.

A job is a hash, ``SpiderKeys.job``, in the group's hash tag (its fields and the keys
beside it are described in ``jobs/lua/include/jobs.lua``). The queue's scripts count a
job's requests in it as they move them; everything else a job goes through is a call
of :class:`JobStore`, one script each:

- created with its seeds (``job_start``), ``running``;
- joined and left by the processes that work on it (``job_join``, ``job_leave``,
  ``job_settle`` drops the dead ones);
- ended, once, in one of :data:`TERMINAL_STATES`: ``done``, ``incomplete`` or
  ``failed`` when its last request is acked (or ``job_reconcile`` finds its requests
  lost), ``closed`` by a limit or its spider (``job_end``, ``job_timeout``),
  ``cancelled`` (``job_cancel``).

The tables Lua shares with Python (the final states, the counters) are generated into
``jobs/lua/include/jobs.lua`` from this module (:func:`lua_tables`), never copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from celery_crawl.core import scripts
from celery_crawl.core.entries import ENTRY_ARGV
from celery_crawl.core.errors import UnknownJob
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.core.repair import REFUSAL, Repairer, retried
from celery_crawl.core.scripts import DUPEFILTER_PARAMETERS, Argv
from celery_crawl.jobs import limits

if TYPE_CHECKING:
    from celery_crawl.core.entries import Entry
    from celery_crawl.dupefilter.filters import DedupScript

RUNNING = "running"
# incomplete: pages were fetched, but requests of the job could not be queued (dropped)
# closed: a limit was reached, or a callback raised CloseSpider (field reason)
TERMINAL_STATES = ("done", "incomplete", "failed", "cancelled", "closed")
# the job hash's counters: integers, each healed to 0 when damaged (core/lua/repair.lua)
COUNTERS = (
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
ARGS_FIELD = "args"  # the job hash field that holds its spider arguments, as JSON

START = Argv(
    "job_start",
    ("job_id", "seed_requests", "job_fields", "dedup_scope"),
    (ENTRY_ARGV, ("field", "value"), DUPEFILTER_PARAMETERS),
)
CLOSE = Argv("job_end", ("job_id", "reason"))
TIMEOUT = Argv("job_timeout", ("job_id", "reason"))
JOIN = Argv("job_join", ("job_id", "joining_scheduler", "registration"))
LEAVE = Argv("job_leave", ("job_id", "leaving_scheduler"))
SETTLE = Argv("job_settle", ("job_id",))
CANCEL = Argv("job_cancel", ("job_id",), (DUPEFILTER_PARAMETERS,))
READ = Argv("job_read")
RECONCILE = Argv("job_reconcile", ("ms_a_job_must_stay",))


def lua_tables() -> str:
    """The Lua constants of ``jobs/lua/include/jobs.lua`` shared with Python."""
    return scripts.lua_constants(
        FINAL=dict.fromkeys(TERMINAL_STATES, True),
        JOB_COUNTERS=COUNTERS,
        LIMITED=limits.counted_reasons(),
    )


def server_time(reply: Sequence[int | bytes | str]) -> float:
    """Seconds since the epoch from the reply of Redis's ``TIME`` (as a script returns it, too)."""
    seconds, micros = reply
    return int(seconds) + int(micros) / 1_000_000


def _fields(flat: list[bytes]) -> dict[bytes, bytes]:
    """A hash from HGETALL's flat reply, as a script returns it."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class JobStore:
    """The jobs of one spider's group: ``keys.job_prefix`` names them all."""

    def __init__(self, client: redis.Redis, keys: SpiderKeys) -> None:
        self.client = client
        self.keys = keys

    def _run(self, layout: Argv, keys: list[str], args: list[Any], **fills: str) -> Any:
        return scripts.script(self.client, layout.script, **fills)(keys=keys, args=args)

    def start(
        self,
        job: str,
        push_keys: list[str],
        seeds: Sequence[Entry],
        fields: dict[str, str],
        *,
        uses_priority: bool,
        dedup: DedupScript,
        dedup_scope: str,
        group: Sequence[SpiderKeys] = (),
    ) -> tuple[bool, int]:
        """Create ``job`` with its seeds, pushed through the dedup filter into the queue whose
        ``push_keys`` are given, unless it exists: (created, seeds accepted). ``group``: the
        other spiders of its group, whose filters its routed requests meet."""
        args = START.build(
            job_id=job, seed_requests=len(seeds), job_fields=len(fields), dedup_scope=dedup_scope
        )
        for entry in seeds:
            args += entry.args(uses_priority)
        for field, value in fields.items():
            args += START.group(1, field=field, value=value)
        args += dedup.params
        filters = [key for keys in group for key in (keys.dupefilter, keys.dupefilter_count)]
        call = scripts.script(self.client, START.script, dupefilter=dedup.lua)
        # refused for a damaged key (nothing written): repaired, with the group's, and sent again
        repairer = Repairer(self.client, self.keys, group)
        created, accepted = retried(repairer, lambda: call(keys=[*push_keys, *filters], args=args))
        return bool(created), int(accepted)

    def exists(self, job: str) -> bool:
        """Whether ``job``'s hash exists: it was started, and has not expired."""
        return bool(self.client.exists(self.keys.job(job)))

    def join(self, job: str, scheduler_id: str) -> tuple[str, str, str]:
        """Join ``job`` as a participant while it runs (``""``: only read):
        (state, spider arguments as JSON, depth limit), ``""`` for what it lacks."""
        args = JOIN.build(
            job_id=job, joining_scheduler=scheduler_id, registration=self.keys.open_schedulers
        )
        reply = self._run(JOIN, [self.keys.job_prefix], args)
        state, job_args, depth = (bytes(value).decode() for value in reply)
        return state, job_args, depth

    def leave(self, job: str, scheduler_id: str) -> int:
        """Leave an ended job's participants; how many are still working on it."""
        args = LEAVE.build(job_id=job, leaving_scheduler=scheduler_id)
        return int(self._run(LEAVE, [self.keys.job_prefix], args))

    def take_ended(self, scheduler_id: str, most: int) -> list[str]:
        """Take up to ``most`` ids off the list of jobs this scheduler joined that ended."""
        taken = self.client.lpop(self.keys.job_ended(scheduler_id), most) or []
        return [_text(job) for job in taken]

    def ended(self, jobs: Sequence[str]) -> list[str]:
        """Those of ``jobs`` that have ended or are gone: one pipelined read of their states."""
        with self.client.pipeline(transaction=False) as pipe:
            for job in jobs:
                pipe.hget(self.keys.job(job), "state")
            states = pipe.execute()
        return [
            job
            for job, state in zip(jobs, states, strict=True)
            if state is None or state.decode() in TERMINAL_STATES
        ]

    def participants(self, job: str) -> int:
        """How many worker processes are still closing their part of the job.

        A process that died stops counting once the job has ended and the process's
        scheduler registration has lapsed (``jobs/lua/job_settle.lua``).
        """
        return self.settle(job)[0]

    def settle(self, job: str) -> tuple[int, dict[bytes, bytes], float]:
        """:meth:`participants`, with what :meth:`read` gives, in one round trip:
        (live participants, the job's hash, the server's clock)."""
        args = SETTLE.build(job_id=job)
        try:
            count, flat, now = self._run(SETTLE, [self.keys.job_prefix], args)
        except redis.ResponseError as exc:
            raise self._damaged(job, exc) from exc
        return int(count), _fields(flat), server_time(now)

    def end(self, job: str, reason: str) -> bool:
        """End running ``job`` now, ``closed`` with ``reason``; False if it was not running."""
        args = CLOSE.build(job_id=job, reason=reason)
        return bool(self._run(CLOSE, [self.keys.job_prefix], args))

    def end_if_out_of_time(self, job: str) -> bool:
        """End the job ``closed`` (``closespider_timeout``) if its ``seconds`` limit has
        passed since it was created, on Redis's clock (``jobs/lua/job_timeout.lua``)."""
        args = TIMEOUT.build(job_id=job, reason=limits.LIMITS["seconds"].reason)
        return bool(self._run(TIMEOUT, [self.keys.job_prefix], args))

    def read(self, job: str) -> tuple[dict[bytes, bytes], float]:
        """The job's hash (empty: no such job) and the server's clock, in one round trip."""
        try:
            flat, now = self._run(READ, [self.keys.job(job)], READ.build())
        except redis.ResponseError as exc:
            raise self._damaged(job, exc) from exc
        return _fields(flat), server_time(now)

    def _damaged(self, job: str, exc: redis.ResponseError) -> Exception:
        """What reading ``job`` raises: :class:`UnknownJob` if its hash is of another type;
        ``exc`` itself for another error (a refusal naming another damaged key, too)."""
        if "WRONGTYPE" not in str(exc) or REFUSAL.search(str(exc)):
            return exc
        return UnknownJob(f"job {job!r}: its key {self.keys.job(job)} is damaged (not a hash)")

    def cancel(self, job: str, spans: Sequence[SpiderKeys], dedup: DedupScript | None) -> int:
        """Stop ``job`` and purge its queued requests from the queues of ``spans``; how many.

        ``dedup`` is the spiders' filter kind: under the spider dedup scope the purged
        requests' fingerprints leave it. A damaged key of any spider it spans is refused
        before anything is purged, repaired with its spider, and the call sent once more.
        """
        lua, params = (dedup.lua, dedup.params) if dedup else ("dedup_exact", ())
        keys = [self.keys.job_prefix, self.keys.site_prefix]
        for span in spans:
            keys += [span.queue, span.dupefilter, span.dupefilter_count]
        args = [*CANCEL.build(job_id=job), *params]
        repairer = Repairer(self.client, self.keys, spans)
        return int(retried(repairer, lambda: self._run(CANCEL, keys, args, dupefilter=lua)))

    def end_lost(
        self, group: Sequence[SpiderKeys], grace_seconds: float, repairer: Repairer | None = None
    ) -> list[str]:
        """End the group's jobs whose requests are gone from Redis: ``incomplete``, with
        ``errors/lost`` (``jobs/lua/job_reconcile.lua``). One script call; the ids it ended.

        Refused for a damaged key (nothing written), the key is repaired with the spider
        of the group it is of, and the call sent once more (:mod:`celery_crawl.core.repair`):
        by ``repairer``, a scheduler's own, so its once-per-``REPAIR_SECONDS`` holds.
        """
        repairer = repairer or Repairer(self.client, group[0], group)
        keys = [self.keys.job_prefix]
        for spider in group:
            keys += [spider.queue, spider.parked, spider.inflight]
        args = RECONCILE.build(ms_a_job_must_stay=int(grace_seconds * 1000))
        ended = retried(repairer, lambda: self._run(RECONCILE, keys, args))
        return [_text(job) for job in ended]


def end_lost_jobs(
    client: redis.Redis,
    group: Sequence[SpiderKeys],
    grace_seconds: float,
    repairer: Repairer | None = None,
) -> list[str]:
    """:meth:`JobStore.end_lost` for the store of ``group``'s jobs."""
    return JobStore(client, group[0]).end_lost(group, grace_seconds, repairer)
