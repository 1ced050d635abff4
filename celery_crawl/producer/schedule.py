"""Sources on their own schedules: a spider's sources in Redis, each due at its own time.

A :class:`Source` is what one job of it crawls (seeds, spider arguments, a priority and
limits) and how often (an interval, fixed or adaptive within bounds). :class:`Schedule`
keeps a spider's sources in Redis, so they are added, changed, paused and removed while
beat runs, with no deploy; ``celery-crawl sources`` does the same from a shell.

Each producer tick (``celery_crawl.produce``, every ``PRODUCER_PERIOD``) starts a job for
every source that is due, in due order, under the producer's caps (``PRODUCER_JOB_CAP``,
``PRODUCER_QUEUE_CAP``), never two at once for one source (``producer/lua/schedule_tick.lua``).
A tick costs the sources due, not every source: they wait in a sorted set by due time.

When a source's job has ended, the source is due again its interval after that job
was produced (start to start), or at once if that has passed. An adaptive source's
interval moves first: times ``SCHEDULE_FASTER`` after a job that found items, times
``SCHEDULE_SLOWER`` after one that found none, within its bounds, in the spirit of
Nutch's AdaptiveFetchSchedule: busy sources come back sooner, quiet ones back off.

A spider with sources in its schedule is produced from them; one without, from
``PRODUCER_SOURCES`` or its Redis set, as before (:mod:`celery_crawl.producer.producer`).
"""

from __future__ import annotations

import json
import logging
import math
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import redis

from celery_crawl.core import scripts
from celery_crawl.core.errors import BadInput, ConfigError, quote
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.core.repair import Repairer, refused_key, retried
from celery_crawl.core.scripts import Argv
from celery_crawl.jobs.inputs import (
    check_args,
    check_priority,
    check_seeds,
    check_source_id,
)
from celery_crawl.jobs.limits import check_limits

logger = logging.getLogger(__name__)

PUT = Argv("schedule_put", ("source_id", "definition", "interval", "paused", "splay"))
SWITCH = Argv("schedule_switch", ("source_id", "pause"))
RELEASE = Argv("schedule_release", ("source_id",))
RECONCILE = Argv("schedule_reconcile", ())
TICK = Argv("schedule_tick", ("job_cap", "queue_cap", "faster", "slower"), tail=("job_ids",))

MIN_INTERVAL = 1.0  # seconds: a source is due at most once a second
MAX_INTERVAL = 365 * 86400.0
# an adaptive source's bounds when it gives none (Nutch's smallest interval is a minute)
ADAPTIVE_MIN = 60.0
ADAPTIVE_MAX = 30 * 86400.0
MAX_RESERVED_PER_TICK = 1000  # job ids sent with one tick: the cap beyond it waits a tick


def lua_constants() -> str:
    """The bounds ``producer/lua/schedule_tick.lua`` holds every interval within."""
    return scripts.lua_constants(MIN_INTERVAL=MIN_INTERVAL, MAX_INTERVAL=MAX_INTERVAL)


@dataclass(frozen=True)
class Source:
    """One source of a spider: what each of its jobs crawls, and how often."""

    id: str
    seeds: list[Any] = field(default_factory=list)
    interval: float = 3600.0  # seconds from one job's start to the next
    adaptive: bool = False  # the interval moves within [min_interval, max_interval]
    min_interval: float | None = None
    max_interval: float | None = None
    priority: int = 0
    args: dict[str, str] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_source_id(self.id)
        check_seeds(self.seeds)
        check_priority(self.priority)
        for name in ("args", "limits"):
            if not isinstance(getattr(self, name), dict):
                raise BadInput(f"source {self.id}: {name} {quote(getattr(self, name))}: a dict")
        check_args(self.args)
        check_limits(self.limits or None)
        self._check_schedule()

    def _check_schedule(self) -> None:
        if not isinstance(self.adaptive, bool):
            raise BadInput(f"source {self.id}: adaptive {quote(self.adaptive)}: true or false")
        for name in ("interval", "min_interval", "max_interval"):
            _check_seconds(name, getattr(self, name), optional=name != "interval")
        if self.adaptive:  # bounds always written down: the tick script reads them
            if self.min_interval is None:
                object.__setattr__(self, "min_interval", min(ADAPTIVE_MIN, self.interval))
            if self.max_interval is None:
                object.__setattr__(self, "max_interval", max(ADAPTIVE_MAX, self.interval))
        low = self.min_interval or self.interval
        high = self.max_interval or self.interval
        if not low <= self.interval <= high:
            raise BadInput(
                f"source {self.id}: interval {self.interval:g} s outside its bounds"
                f" [{low:g}, {high:g}]"
            )

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Source:
        """A source from a definition (JSON, YAML or TOML data); unknown fields are refused."""
        if not isinstance(data, Mapping):
            raise BadInput(f"a source {quote(data)}: a mapping of its fields")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise BadInput(f"source {quote(data.get('id'))}: unknown fields {sorted(unknown)}")
        if "id" not in data:
            raise BadInput(f"a source {quote(data)}: no id")
        try:
            return cls(**data)
        except TypeError as exc:  # a field of the wrong kind that a check did not name
            raise BadInput(f"source {quote(data.get('id'))}: {exc}") from None


def splay_seconds(source: Source) -> float:
    """Where in its first interval a source added with ``splay`` is first due: a fraction
    of it taken from a hash of its id, so the same source always gets the same one."""
    fraction = zlib.crc32(source.id.encode()) / 2**32
    return round(fraction * source.interval, 3)


def _check_seconds(name: str, value: Any, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadInput(f"{name} {quote(value)}: seconds, a finite number")
    if not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise BadInput(f"{name} {value:g} s: from {MIN_INTERVAL:g} s to a year")


@dataclass(frozen=True)
class SourceState:
    """A source and where it stands: due when, paused, or running a job."""

    source: Source
    interval: float  # the current one: an adaptive source's moves
    due_at: float | None  # unix seconds; None while paused or while a job of it runs
    paused: bool
    running_job: str | None


class Reserved(NamedTuple):
    """A source a tick reserved, for the job ``job_id``: when it was due, and when the
    tick reserved it (unix seconds, the server's clock). Its next due time counts from
    ``reserved_at`` (start to start)."""

    source: Source
    job_id: str
    due_at: float
    reserved_at: float


@dataclass(frozen=True)
class ScheduleTick:
    """What one tick of a schedule decided."""

    produced: list[Reserved]
    still_due: int  # sources due and held back (the caps), overdue from now on
    queued: int


def schedule_keys(keys: SpiderKeys) -> list[str]:
    """The keys of ``keys``' schedule, which every schedule script (``schedule_*.lua``, and
    the producer's ``produce.lua``) takes first, in this order
    (``producer/lua/include/schedule.lua``)."""
    return [
        keys.schedule_sources,
        keys.schedule_due,
        keys.schedule_paused,
        keys.schedule_intervals,
        keys.producer_running,
    ]


class Schedule:
    """The sources of ``keys``' spider; ``group`` is every spider of its group (default: it)."""

    def __init__(
        self, client: redis.Redis, keys: SpiderKeys, group: list[SpiderKeys] | None = None
    ) -> None:
        self.client = client
        self.keys = keys
        self.group = group or [keys]
        self.repairer = Repairer(client, keys, self.group)

    def _run(self, layout: Argv, args: list[Any], own_keys: Sequence[str] = ()) -> Any:
        """One call of a schedule script, with the schedule's keys (:func:`schedule_keys`)
        then the script's ``own_keys``; refused for a damaged key, the key is moved
        aside, the schedule reconciled (:meth:`reconcile`), and the call sent again."""
        call = scripts.script(self.client, layout.script)
        keys = [*schedule_keys(self.keys), *own_keys]
        try:
            return call(keys=keys, args=args)
        except redis.ResponseError as exc:
            named = set(refused_key(exc))
            if self.repairer.after(exc) is None:
                raise
        if not named or named & set(schedule_keys(self.keys)):  # reads every source: rare
            try:
                self.reconcile()
            except redis.ResponseError as exc:  # another key damaged: the call names it
                logger.error("schedule of %s not reconciled: %s", self.keys.spider, exc)
        return call(keys=keys, args=args)

    def reconcile(self) -> tuple[int, int]:
        """After a repair: a source neither due, paused nor running is due now, and the
        entries of sources that are gone are dropped; (made due, dropped). It reads
        every source: the repair runs it, a tick does not."""
        made_due, dropped = (int(n) for n in self._call(RECONCILE))
        if made_due or dropped:
            logger.warning(
                "schedule of %s reconciled: %d sources due again, %d stale entries dropped",
                self.keys.spider,
                made_due,
                dropped,
            )
        return made_due, dropped

    def _call(self, layout: Argv) -> Any:
        """A schedule script that takes no ARGV, called once (no repair)."""
        return scripts.script(self.client, layout.script)(keys=schedule_keys(self.keys), args=[])

    # -- managing sources ------------------------------------------------------

    def put(self, source: Source, *, paused: bool | None = None, splay: bool = False) -> str:
        """Add ``source``, or change it: ``"added"``, ``"changed"`` or ``"unchanged"``.

        A new source is due now; with ``splay``, at a point of its first interval
        that its id decides (:func:`splay_seconds`), so that sources added together
        do not all come due together, tick after tick. ``paused``: True pauses it,
        False resumes it, None (the default) leaves a source as it was. A changed
        source keeps its due time (or comes sooner, to be due one new interval from
        now), and its current interval unless its ``interval`` changed.
        """
        args = PUT.build(
            source_id=source.id,
            definition=source.to_json(),
            interval=source.interval,
            paused="" if paused is None else int(paused),
            splay=splay_seconds(source) if splay else 0,
        )
        return ("changed", "added", "unchanged")[int(self._run(PUT, args))]

    def pause(self, source_id: str) -> bool:
        """Produce no more jobs of the source (one running goes on); False: no such source."""
        return self._switch(source_id, pause=True)

    def resume(self, source_id: str) -> bool:
        """Make the source due again: now, or when its running job ends."""
        return self._switch(source_id, pause=False)

    def _switch(self, source_id: str, *, pause: bool) -> bool:
        args = SWITCH.build(source_id=check_source_id(source_id), pause=int(pause))
        return bool(self._run(SWITCH, args))

    def remove(self, source_id: str) -> bool:
        """Remove the source (a job of it that runs goes on); False: no such source."""
        with self.client.pipeline(transaction=True) as pipe:  # one atomic round trip
            pipe.hdel(self.keys.schedule_sources, source_id)
            pipe.zrem(self.keys.schedule_due, source_id)
            pipe.srem(self.keys.schedule_paused, source_id)
            pipe.hdel(self.keys.schedule_intervals, source_id)
            removed, *_ = pipe.execute()
        return bool(removed)

    def __len__(self) -> int:
        key = self.keys.schedule_sources

        def count() -> int:
            try:
                return int(self.client.hlen(key))
            except redis.ResponseError as exc:  # of another type: moved aside, counted again
                if "WRONGTYPE" not in str(exc):
                    raise
                damaged = f"WRONGTYPE damaged key {key}: it should hold a hash"
                raise redis.ResponseError(damaged) from exc

        return retried(self.repairer, count)

    def get(self, source_id: str) -> SourceState | None:
        """The source and where it stands, read in one round trip; None if there is none."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hget(self.keys.schedule_sources, source_id)
            pipe.zscore(self.keys.schedule_due, source_id)
            pipe.sismember(self.keys.schedule_paused, source_id)
            pipe.hget(self.keys.schedule_intervals, source_id)
            pipe.hget(self.keys.producer_running, source_id)
            definition, due, paused, interval, running = pipe.execute()
        if definition is None:
            return None
        return self._state(source_id, definition, due, paused=bool(paused), raw=(interval, running))

    def states(self) -> list[SourceState]:
        """Every source and where it stands, by id, read in one round trip (``list``,
        ``export``); a definition that cannot be read is logged and left out."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.schedule_sources)
            pipe.zrange(self.keys.schedule_due, 0, -1, withscores=True)
            pipe.smembers(self.keys.schedule_paused)
            pipe.hgetall(self.keys.schedule_intervals)
            pipe.hgetall(self.keys.producer_running)
            definitions, due, paused, intervals, running = pipe.execute()
        due_at = dict(due)
        found = []
        for raw_id, definition in sorted(definitions.items()):
            source_id = raw_id.decode("utf-8", "replace")
            raw = (intervals.get(raw_id), running.get(raw_id))
            state = self._state(
                source_id, definition, due_at.get(raw_id), paused=raw_id in paused, raw=raw
            )
            if state is not None:
                found.append(state)
        return found

    def _state(
        self,
        source_id: str,
        definition: bytes,
        due: float | None,
        *,
        paused: bool,
        raw: tuple[bytes | None, bytes | None],
    ) -> SourceState | None:
        """A source's state from what Redis holds: ``raw`` is its current interval and
        its running reservation (``job id|reserved at``)."""
        interval, running = raw
        source = self._parse(source_id, definition)
        if source is None:
            return None
        return SourceState(
            source=source,
            interval=float(interval) if interval is not None else source.interval,
            due_at=due / 1000 if due is not None else None,
            paused=paused,
            running_job=running.decode().partition("|")[0] if running else None,
        )

    def sources(self) -> list[Source]:
        """Every source, by id; a definition that cannot be read is logged and left out."""
        found: dict[bytes, bytes] = self.client.hgetall(self.keys.schedule_sources)  # type: ignore[assignment]
        parsed = (self._parse(key.decode("utf-8", "replace"), raw) for key, raw in found.items())
        return sorted((source for source in parsed if source is not None), key=lambda s: s.id)

    def _parse(self, source_id: str, definition: bytes) -> Source | None:
        try:
            return Source.from_mapping(json.loads(definition))
        except (ValueError, BadInput) as exc:
            logger.error(
                "schedule of %s: source %s unreadable, left out: %s",
                self.keys.spider,
                quote(source_id),
                exc,
            )
            return None

    # -- the tick --------------------------------------------------------------

    def reserve(self, job_cap: int, queue_cap: int, faster: float, slower: float) -> ScheduleTick:
        """Reserve the sources due now, in due order, with fresh job ids (one script call)."""
        own_keys = [self.keys.stats, self.keys.job_prefix, *(m.queue for m in self.group)]
        job_ids = [uuid.uuid4().hex for _ in range(min(job_cap, MAX_RESERVED_PER_TICK))]
        args = TICK.build(job_cap=job_cap, queue_cap=queue_cap, faster=faster, slower=slower)
        reply = self._run(TICK, args + TICK.rest(job_ids=job_ids), own_keys)
        queued, still_due, now_ms, *flat = reply
        produced = []
        for i in range(0, len(flat), 4):
            source_id, job_id = flat[i].decode(), flat[i + 1].decode()
            source = self._parse(source_id, flat[i + 2])
            if source is None:  # JSON, but breaks a rule: paused until put again
                self._run(SWITCH, SWITCH.build(source_id=source_id, pause=1))
                continue
            produced.append(Reserved(source, job_id, float(flat[i + 3]) / 1000, now_ms / 1000))
        return ScheduleTick(produced, int(still_due), int(queued))

    def tick(
        self,
        start: Callable[[Reserved], Any],
        *,
        job_cap: int,
        queue_cap: int,
        faster: float,
        slower: float,
    ) -> ScheduleTick:
        """Reserve the sources due, then start a job of each with ``start(reserved)``
        (:class:`Reserved`: the source, the job id, when it was due and reserved).

        A job that cannot be started gives its reservation back: its source is due
        again at the next tick, its interval unchanged. ``faster`` and ``slower``
        (``PRODUCER_ADAPTIVE_FASTER`` and ``_SLOWER``) move adaptive intervals.
        """
        if not (0 < faster <= 1 <= slower and math.isfinite(slower)):
            raise ConfigError(
                f"PRODUCER_ADAPTIVE_FASTER {faster!r} must be in (0, 1] and"
                f" PRODUCER_ADAPTIVE_SLOWER {slower!r} a finite number of 1 or more"
            )
        tick = self.reserve(job_cap, queue_cap, faster, slower)
        for reserved in tick.produced:
            source = reserved.source
            try:
                start(reserved)
            except BadInput as exc:  # the spider refuses it: every tick would, so it waits
                logger.error("schedule: source %s paused: %s", quote(source.id), exc)
                self.pause(source.id)
            except Exception:
                logger.exception("schedule: job for %s not started; released", quote(source.id))
                self._release(source.id)
        logger.info(
            "schedule %s: produced %d sources, %d still due (queue %d, cap %d jobs / %d requests)",
            self.keys.spider,
            len(tick.produced),
            tick.still_due,
            tick.queued,
            job_cap,
            queue_cap,
        )
        return tick

    def _release(self, source_id: str) -> None:
        """A reservation given back: the source is due now again, unless paused since."""
        args = RELEASE.build(source_id=source_id)
        self._run(RELEASE, args)
