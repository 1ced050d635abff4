"""The shared request queues, with leases.

Redis layout, for a queue key ``Q`` (see :mod:`celery_crawl.core.keys`):

- ``Q``           sorted set of the priority levels in use, score = -priority,
                  so the lowest score is the highest priority;
- ``Q:<p>``       a list per level, holding encoded requests in arrival order (popped
                  at the head, FIFO, or at the tail, LIFO: the class's ``pop_side``);
- ``Q:inflight``  sorted set of leases, score = deadline in unix ms;
- ``Q:seq``       lease counter;
- ``Q:signal``    short list of wake-up tokens for blocked pops, and the pub/sub
                   channel that pushes publish on (:mod:`celery_crawl.core.notices`);
- ``Q:schedulers`` sorted set of the schedulers that have the queue open, score =
                  registration deadline in unix ms (renewed while they run).
- ``Q:written:<writer>`` string: a scheduler's last applied enqueue call,
                  ``<number>:<flags>``, so that a call sent twice counts once
                  (expires an hour after the writer's last call).

A list entry is ``1-byte job id length + job id + encoded request``; under the
spider dedup scope, a job's filtered request also carries its fingerprint
(the length byte's bit 128 set, then ``1-byte length + fingerprint`` after
the job id), so that ``Job.cancel()`` can take it out of the filter; with
per-site limits it carries its site (bit 64, then ``1-byte length + site``),
which the lease holds to the site's limits (:mod:`celery_crawl.politeness.sites`). A lease
member is ``8-byte lease id + 4-byte priority + entry``: unique, so identical
payloads never merge, and self-contained, so an expired lease goes back to the
front of its level, and an ack finds its job, without another lookup. Lists cost a few bytes
per entry where a sorted set of payloads costs about 80.

Every change is one Lua script or one command. With ``ack_replicas`` set
(``CELERY_CRAWL_ACK_REPLICAS``), a script that acks is pipelined with
``WAIT ack_replicas timeout`` on the same connection: still one round trip,
and the scheduler moves on only once the replicas hold the ack, or the timeout passed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from celery_crawl.core import connection, scripts
from celery_crawl.core.defaults import SETTINGS
from celery_crawl.core.entries import ENTRY_ARGV, Entry, Lease
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import WRITTEN_KEPT_MS, SpiderKeys
from celery_crawl.core.scripts import DUPEFILTER_PARAMETERS, Argv
from celery_crawl.dupefilter.filters import EXACT_DEDUP, DedupScript
from celery_crawl.jobs.store import JobStore
from celery_crawl.politeness.sites import SITE_LEASE_ARGV, SitePolicy
from celery_crawl.queue.leases import LeaseTimes

logger = logging.getLogger(__name__)

MAX_BLOCK_SECONDS = 10.0  # one BLPOP wait; stays below the client's socket timeout
MIN_BLOCK_SECONDS = 0.01  # BLPOP's timeout 0 would block for good
DEDUP_SCOPES = ("job", "spider")  # DUPEFILTER_SCOPE: whose filter a job's requests meet
ENQUEUE = Argv(
    "enqueue",
    (
        "requests",
        "job_stat_changes",
        "leases_to_ack",
        "dead_letter_records",
        "most_records",
        "dedup_scope",
        "writer_number",
        "milliseconds_record_kept",
        "participant_id",
        "acked_stat_changes",
        "jobs_to_end",
    ),
    (
        ENTRY_ARGV,
        ("job_id", "field", "delta"),
        ("lease_number", "job_id", "field", "delta"),
        ("lease_members",),
        ("dead_letter_records",),
        ("job_id", "reason"),
        DUPEFILTER_PARAMETERS,
    ),
)
LEASE = Argv(
    "lease",
    ("most_requests", "lease_duration_ms", "pop_side", "most_records", *SITE_LEASE_ARGV),
)
DEAD_LETTER = Argv("dead_letter", ("lease_member", "record", "most_records", "field"))
ACK = Argv("ack", tail=("lease_members",))
RENEW = Argv("renew", ("lease_duration_ms",), tail=("lease_members",))
REQUEUE = Argv("requeue", ("pop_side", "most_expired", "most_records"), tail=("lease_members",))
QUEUE_SIZE = Argv("queue_size")
QUEUE_PENDING = Argv("queue_pending")
QUEUE_CLEAR = Argv("queue_clear")
SCHEDULER_JOIN = Argv("scheduler_join", ("scheduler_id", "milliseconds_registration_lasts"))
SCHEDULER_LEAVE = Argv("scheduler_leave", ("scheduler_id", "clear"), (DUPEFILTER_PARAMETERS,))


class Base:
    """Shared by every queue class; subclasses pick the pop end and priority use."""

    pop_side: ClassVar[str] = "head"
    uses_priority: ClassVar[bool] = True

    def __init__(
        self,
        client: redis.Redis,
        keys: SpiderKeys,
        lease_seconds: float = SETTINGS["SCHEDULER_LEASE_SECONDS"].default,
        dedup: DedupScript = EXACT_DEDUP,
        *,
        ack_replicas: int = SETTINGS["CELERY_CRAWL_ACK_REPLICAS"].default,
        ack_timeout: float = SETTINGS["CELERY_CRAWL_ACK_TIMEOUT"].default,
        deadletter_max: int = SETTINGS["SCHEDULER_DEADLETTER_MAX"].default,
        dedup_scope: str = SETTINGS["DUPEFILTER_SCOPE"].default,
        sites: SitePolicy | None = None,
        leases: LeaseTimes | None = None,
    ) -> None:
        """``lease_seconds``: every lease's time; ``leases``, if given, decides them instead
        (:mod:`celery_crawl.queue.leases`)."""
        if dedup_scope not in DEDUP_SCOPES:
            raise ConfigError(
                f"DUPEFILTER_SCOPE is {dedup_scope!r}: use {' or '.join(map(repr, DEDUP_SCOPES))}"
            )
        self.dedup_scope = dedup_scope
        self.sites = sites or SitePolicy(enabled=False)
        self.next_ready: float | None = None  # after an empty lease: s until a parked site may
        self.client = client
        self.keys = keys
        self.leases = leases if leases is not None else LeaseTimes(lease_seconds)
        self.dedup = dedup
        self.ack_replicas = ack_replicas
        self.ack_timeout = ack_timeout
        self.deadletter_max = max(1, deadletter_max)
        self.job_store = JobStore(client, keys)  # the jobs its requests belong to
        if ack_replicas and connection.is_cluster(client):
            raise ConfigError("CELERY_CRAWL_ACK_REPLICAS is not supported on a Redis Cluster")

    def push_many(
        self,
        entries: Sequence[Entry],
        acks: Sequence[bytes] = (),
        job_stats: Sequence[tuple[str, str, int]] = (),
        routed: Sequence[tuple[Base, Sequence[Entry]]] = (),
        dead_letters: Sequence[str] = (),
        *,
        ack_stats: Sequence[Mapping[tuple[str, str], int]] = (),
        ends: Sequence[tuple[str, str]] = (),
        call: tuple[str, int] | None = None,
        participant: str = "",
    ) -> list[bool]:
        """Enqueue ``entries``, add ``job_stats``, keep ``dead_letters``, end ``ends``'
        jobs, then ack ``acks``.

        One atomic round trip. ``routed`` holds requests for the queues of
        other spiders of the same group (same hash tag, same dupefilter
        class): they go in the same step. ``dead_letters`` are records of
        requests that could not be queued, pushed onto the dead-letter list
        (kept to ``deadletter_max``). Returns a flag per entry, ``entries``
        first and then each routed batch in order: False when the dedup filter
        had seen it, or its job no longer runs. Acking the parent in the same
        step as its children means a crash never leaves a finished parent
        whose children were not enqueued, and a job is never seen done while
        one is missing.

        ``call`` is ``(writer, number)``: a writer numbers its calls, and a call
        Redis already applied (its reply lost, the call sent again, by redis-py's
        retry or the writer's) changes nothing the second time and returns the
        flags of the first: counters and dead letters are added once.

        ``participant`` is the writer's scheduler id: ``job_stats`` of a job that
        has ended, when it is not among the job's participants (cut off, back
        late), are kept apart in the job's ``late/*`` fields, and logged.

        ``ack_stats[i]`` are the stats of ``acks[i]``'s page, ``{(job, field): delta}``:
        they count only if that lease is still held, or its job has ended. One that
        lapsed while its job runs was requeued and is acked by the fetch that holds it
        now, so these go to ``late/*``: the page counts once.

        ``ends`` are ``(job, reason)``: jobs a callback asked to end (``CloseSpider``).
        Each running one ends ``closed`` after this call's stats count in it and before
        its acks, so that the ack of the page that asked does not end it ``done``.
        """
        batches = [entries, *(batch for _, batch in routed)]
        count = sum(len(batch) for batch in batches)
        if len(ack_stats) > len(acks):
            raise ValueError(f"the stats of {len(ack_stats)} acks, for {len(acks)} acks")
        if not (count or acks or job_stats or dead_letters or ends):
            return []
        acked = [
            (i, job, field, delta)
            for i, stats in enumerate(ack_stats, 1)
            for (job, field), delta in stats.items()
            if delta
        ]
        writer, number = call if call else ("", "")
        args = ENQUEUE.build(
            requests=count,
            job_stat_changes=len(job_stats),
            leases_to_ack=len(acks),
            dead_letter_records=len(dead_letters),
            most_records=self.deadletter_max,
            dedup_scope=self.dedup_scope,
            writer_number=number,
            milliseconds_record_kept=WRITTEN_KEPT_MS,
            participant_id=participant,
            acked_stat_changes=len(acked),
            jobs_to_end=len(ends),
        )
        for lane, batch in enumerate(batches):
            for entry in batch:
                args += entry.args(self.uses_priority, lane)  # ENTRY_ARGV
        for stat in job_stats:
            args += stat  # (job id, field, delta): JobStats.drain's tuples
        for change in acked:
            args += change  # (lease number, job id, field, delta)
        args += [*acks, *dead_letters]
        for end in ends:
            args += end  # (job id, reason)
        args += self.dedup.params
        keys = [*self._push_keys(), self.keys.deadletter, self.keys.written(writer)]
        keys += [self.keys.site_prefix]
        keys += [key for queue, _ in routed for key in queue._lane_keys()]
        script = self._script("enqueue", dupefilter=self.dedup.lua)
        reply = self._acking(script, keys, args) if acks else script(keys=keys, args=args)
        self._log_late(reply[count:])
        return [bool(flag) for flag in reply[:count]]

    def _log_late(self, jobs: Sequence[bytes | str]) -> None:
        """Jobs whose stats in a call came after they ended: Redis kept them apart (late/*)."""
        for job in jobs:
            job_id = job.decode() if isinstance(job, bytes) else job
            logger.warning(
                "job %s had ended: this process's stats of it came late, kept apart in its"
                " late/* fields (or dropped, if the job's hash had expired)",
                job_id,
            )

    def start_job(
        self,
        job: str,
        seeds: Sequence[Entry],
        fields: dict[str, str],
        group: Sequence[SpiderKeys] = (),
    ) -> tuple[bool, int]:
        """Create job ``job`` with its seeds in this queue, unless it exists: (created,
        seeds accepted). The job store runs it (``jobs/lua/job_start.lua``); ``group``
        names the other spiders of the group, whose filters the job's routed requests meet."""
        return self.job_store.start(
            job,
            self._push_keys(),
            seeds,
            fields,
            uses_priority=self.uses_priority,
            dedup=self.dedup,
            dedup_scope=self.dedup_scope,
            group=[keys for keys in group if keys.spider != self.keys.spider],
        )

    def _push_keys(self) -> list[str]:
        return [*self._lane_keys(), self.keys.inflight, self.keys.job_prefix]

    def _lane_keys(self) -> list[str]:
        """This queue as a lane of an enqueue script (see ``queue/lua/enqueue.lua``)."""
        keys = self.keys
        return [keys.queue, keys.signal, keys.dupefilter, keys.dupefilter_count]

    def _script(self, name: str, **includes: str) -> Any:
        return scripts.script(self.client, name, **includes)

    def _run(self, layout: Argv, keys: list[str], args: list[Any], **includes: str) -> Any:
        """Run ``layout``'s script with ``args`` built from it."""
        return self._script(layout.script, **includes)(keys=keys, args=args)

    def entry(self, request: Any, payload: bytes, fingerprint: bytes | None, job: str) -> Entry:
        """``request``, encoded as ``payload``, as this queue takes it: with its priority,
        and the site it counts against when site limits are on. The one place where an
        entry is made from a request (the scheduler's children, a job's seeds); raises
        :class:`~celery_crawl.core.errors.ConfigError` for a site that cannot be one."""
        return Entry(payload, request.priority, fingerprint, job, self.sites.site_of(request))

    def push(self, payload: bytes, priority: int = 0, fingerprint: bytes | None = None) -> bool:
        return self.push_many([Entry(payload, priority, fingerprint)])[0]

    def lease(self, count: int = 1) -> list[Lease]:
        """Take up to ``count`` requests at once, without waiting.

        With per-site limits, a request whose site may not take one more now
        stays parked; when nothing was leased, :attr:`next_ready` says in how
        many seconds a parked site may take one (None: none is parked).
        """
        keys = [self.keys.queue, self.keys.inflight, self.keys.seq, self.keys.job_prefix]
        keys += [self.keys.deadletter, self.keys.stats, self.keys.site_prefix]
        args = LEASE.build(
            most_requests=count,
            pop_side=self.pop_side,
            most_records=self.deadletter_max,
            **self.leases.lease_args(),
            **self.sites.lease_args(),
        )
        self.next_ready = None  # a call that fails leaves no due time: nothing to wake for
        members, wait = self._run(LEASE, keys, args)
        self.next_ready = None if int(wait) < 0 else int(wait) / 1000
        return [Lease(m) for m in members]

    def pop(self, timeout: float = 0, count: int = 1) -> list[Lease]:
        """Lease up to ``count`` requests, waiting at most ``timeout`` seconds for one."""
        deadline = time.monotonic() + timeout
        while True:
            leases = self.lease(count)
            remaining = deadline - time.monotonic()
            if leases or remaining <= 0:
                return leases
            due = MAX_BLOCK_SECONDS if self.next_ready is None else self.next_ready
            wait = min(remaining, MAX_BLOCK_SECONDS, due)
            self.client.blpop([self.keys.signal], timeout=max(wait, MIN_BLOCK_SECONDS))

    def dead_letter(self, member: bytes, record: str, kind: str) -> bool:
        """End a lease whose entry cannot become a request, with its dead-letter record.

        Its job counts it in ``errors/dead_letter/<kind>``; its pending count is
        left alone (``queue/lua/dead_letter.lua`` says why). False if it was not leased.
        """
        keys = [self.keys.inflight, self.keys.job_prefix, self.keys.deadletter]
        keys += [self.keys.queue, self.keys.site_prefix]
        args = DEAD_LETTER.build(
            lease_member=member,
            record=record,
            most_records=self.deadletter_max,
            field=f"errors/dead_letter/{kind}",
        )
        return bool(self._run(DEAD_LETTER, keys, args))

    def ack(self, members: Sequence[bytes]) -> int:
        """Finish leases now: the requests are done, and their jobs count them."""
        if not members:
            return 0
        keys = [self.keys.inflight, self.keys.job_prefix, self.keys.queue, self.keys.site_prefix]
        args = ACK.rest(lease_members=members)
        return int(self._acking(self._script(ACK.script), keys, args))

    def _acking(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        """Run a script that acks; with ``ack_replicas``, WAIT for them in the same round trip."""
        if not self.ack_replicas:
            return script(keys=keys, args=args)
        reply, replicas = self._script_then_wait(script, keys, args)
        if replicas < self.ack_replicas:
            logger.warning(
                "acks reached %d of %d replicas within %s s",
                replicas,
                self.ack_replicas,
                self.ack_timeout,
            )
        return reply

    def _script_then_wait(
        self, script: Script, keys: list[str], args: list[Any]
    ) -> tuple[Any, int]:
        """EVALSHA and WAIT pipelined on one connection; loads the script if the server lacks it."""
        for _ in range(2):
            with self.client.pipeline(transaction=False) as pipe:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.wait(self.ack_replicas, int(self.ack_timeout * 1000))
                reply, replicas = pipe.execute(raise_on_error=False)
            if not isinstance(reply, NoScriptError):
                break
            script.sha = str(self.client.script_load(script.script))
        if isinstance(reply, Exception):
            raise reply
        return reply, int(replicas)

    def renew(self, members: Sequence[bytes], seconds: float | None = None) -> int:
        """Renew leases still held, ``seconds`` (default: their lease time) from now."""
        if not members:
            return 0
        keys = [self.keys.inflight, self.keys.queue, self.keys.site_prefix]
        args = RENEW.build(**self.leases.renew_args(seconds)) + RENEW.rest(lease_members=members)
        return int(self._run(RENEW, keys, args))

    def requeue_expired(self, limit: int = 1000) -> int:
        """Put requests whose lease ran out back at the front of their level."""
        return self._requeue(limit, ())

    def release(self, members: Sequence[bytes]) -> int:
        """Hand leases back now (shutdown), instead of waiting for them to expire."""
        return self._requeue(0, members) if members else 0

    def _requeue(self, limit: int, members: Sequence[bytes]) -> int:
        args = REQUEUE.build(
            pop_side=self.pop_side, most_expired=limit, most_records=self.deadletter_max
        )
        args += REQUEUE.rest(lease_members=members)
        keys = [self.keys.queue, self.keys.inflight, self.keys.signal, self.keys.job_prefix]
        keys += [self.keys.deadletter, self.keys.stats, self.keys.seq, self.keys.site_prefix]
        return int(self._run(REQUEUE, keys, args))

    def check_room(self) -> None:
        """Raise ``OutOfMemoryError`` while Redis refuses writes for memory; change nothing.

        ``SETRANGE`` of an empty range is a write that may grow memory, so Redis
        refuses it then; otherwise it writes nothing (``queue/lua/include/room.lua``).
        """
        self.client.setrange(self.keys.seq, 0, "")

    def __len__(self) -> int:
        return int(self._run(QUEUE_SIZE, [self.keys.queue], QUEUE_SIZE.build()))

    def in_flight(self) -> int:
        return int(self.client.zcard(self.keys.inflight))

    def pending(self) -> tuple[int, int]:
        """(queued, leased by any process): both counted in one atomic step."""
        keys = [self.keys.queue, self.keys.inflight]
        queued, leased = self._run(QUEUE_PENDING, keys, QUEUE_PENDING.build())
        return int(queued), int(leased)

    def clear(self) -> None:
        keys = [*self._queue_keys(), self.keys.site_prefix]
        self._run(QUEUE_CLEAR, keys, QUEUE_CLEAR.build())

    def _queue_keys(self) -> list[str]:
        return [self.keys.queue, self.keys.inflight, self.keys.seq, self.keys.signal]

    def register(self, scheduler_id: str, seconds: float) -> int:
        """Register (or renew) an open scheduler for ``seconds``; how many are open."""
        args = SCHEDULER_JOIN.build(
            scheduler_id=scheduler_id, milliseconds_registration_lasts=max(1, int(seconds * 1000))
        )
        return int(self._run(SCHEDULER_JOIN, [self.keys.open_schedulers], args))

    def unregister(self, scheduler_id: str, clear: bool) -> tuple[int, int]:
        """Unregister a scheduler; with ``clear``, the last one open clears queue and dedup.

        The last one also ends the crawl they made (``celery_crawl.scheduler.crawl_state``),
        ``clear`` or not.

        Returns (schedulers still open, keys deleted), in one atomic step.
        """
        keys = [self.keys.open_schedulers, *self._queue_keys()]
        keys += [self.keys.dupefilter, self.keys.dupefilter_count, self.keys.site_prefix]
        keys += [self.keys.crawl]
        args = SCHEDULER_LEAVE.build(scheduler_id=scheduler_id, clear=1 if clear else 0)
        args += self.dedup.params  # SCHEDULER_LEAVE's DUPEFILTER_PARAMETERS
        still_open, deleted = self._run(SCHEDULER_LEAVE, keys, args, dupefilter=self.dedup.lua)
        return int(still_open), int(deleted)


class PriorityQueue(Base):
    """Higher ``priority`` first; FIFO among equal priorities. The default."""


class FifoQueue(Base):
    """First in, first out; ``priority`` is ignored."""

    uses_priority = False


class LifoQueue(Base):
    """Last in, first out (depth-first); ``priority`` is ignored."""

    uses_priority = False
    pop_side = "tail"


class LifoPriorityQueue(Base):
    """Higher ``priority`` first; last in, first out among equal priorities: Scrapy's own order.

    Scrapy's default scheduler queues (``ScrapyPriorityQueue`` over
    ``LifoMemoryQueue``) crawl depth-first within a priority. The levels are
    the same lists as :class:`PriorityQueue`'s: the lease script pops a level
    at its tail, and a request handed back goes back to the tail.
    """

    pop_side = "tail"


QUEUE_CLASSES: dict[str, type[Base]] = {
    "celery_crawl.queue.PriorityQueue": PriorityQueue,
    "celery_crawl.queue.FifoQueue": FifoQueue,
    "celery_crawl.queue.LifoQueue": LifoQueue,
    "celery_crawl.queue.LifoPriorityQueue": LifoPriorityQueue,
    # scrapy-redis names, so its SCHEDULER_QUEUE_CLASS settings carry over
    "scrapy_redis.queue.PriorityQueue": PriorityQueue,
    "scrapy_redis.queue.FifoQueue": FifoQueue,
    "scrapy_redis.queue.LifoQueue": LifoQueue,
    "scrapy_redis.queue.SpiderPriorityQueue": PriorityQueue,
    "scrapy_redis.queue.SpiderQueue": FifoQueue,
    "scrapy_redis.queue.SpiderStack": LifoQueue,
}
