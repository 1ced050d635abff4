"""Damaged keys, moved aside so that the crawl goes on.

Every key of a spider has one type ([redis-layout.md](../docs/redis-layout.md)).
A key of another type, written by something else, makes every script that
touches it fail (``WRONGTYPE``), and a job counter that is not a number fails
every ``HINCRBY`` on it. The scheduler then keeps what it was writing, and
calls :func:`repair`, at most once per :data:`REPAIR_SECONDS` a spider. A script
checks the keys it writes before its first write (``core/lua/include/keytypes.lua``)
and refuses the call whole, naming the damaged key; that key is repaired with
the spider of the group it is of (:func:`owner`: the spider requests are routed
to, say), and the call is sent again:

- each key of the wrong type, or a counter that is not an integer, is
  renamed to ``<key>~damaged`` (kept for a look, never read again), so the
  scripts start it afresh;
- a running job whose counter is not an integer ends ``closed``, with reason
  ``damaged: <counter>`` (its old value kept in ``<counter>~damaged``).

Both are counted in the spider's stats (``celery_crawl/damaged/keys`` and
``/jobs``) and logged. What a key held is lost with it: a dedup key's
fingerprints (those requests may be fetched again), a level list's requests
(their jobs end ``incomplete``, see ``jobs/lua/job_reconcile.lua``).

``core/lua/repair.lua`` checks each key's type again in the step that renames it:
what this module reads only chooses which keys to look at.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis

from celery_crawl.core import scripts
from celery_crawl.core.keys import SpiderKeys

logger = logging.getLogger(__name__)
T = TypeVar("T")
REPAIR_SECONDS = 5.0  # a process repairs a spider's keys at most this often
MAX_DYNAMIC_KEYS = 10_000  # level lists, parked lists, dedup buckets and jobs looked at


def text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def fixed_keys(keys: SpiderKeys) -> dict[str, str]:
    """The spider's keys whose names do not depend on the data, with their types."""
    return {
        keys.queue: "zset",
        keys.inflight: "zset",
        keys.signal: "list",
        keys.seq: "counter",
        keys.open_schedulers: "zset",
        keys.crawl: "hash",
        keys.parked: "zset",
        keys.stats_types: "hash",
        keys.deadletter: "list",
        keys.dupefilter_count: "counter",
        keys.job_states: "hash",
        keys.active_jobs: "set",
        keys.producer_running: "hash",
        keys.producer_cursor: "string",
        keys.schedule_sources: "hash",
        keys.schedule_due: "zset",
        keys.schedule_paused: "set",
        keys.schedule_intervals: "hash",
    }


def _members(client: redis.Redis, key: str, command: str) -> list[str]:
    """A sorted set's or set's members; none when it is of another type (moved aside first)."""
    try:
        if command == "zset":
            found: Any = client.zrange(key, 0, MAX_DYNAMIC_KEYS - 1)
        else:
            found = client.smembers(key)
    except redis.ResponseError:
        return []
    return [text(m) for m in found]


# Keys of packages above this layer that the data names, with their types: each package
# hands its finder over as it is imported (a dedup filter's keys, of whichever kind:
# ``celery_crawl.dupefilter.keys``, imported by every process that builds the scripts
# that write them)
KeyFinder = Callable[[redis.Redis, SpiderKeys], dict[str, str]]
_finders: list[KeyFinder] = []


def find_keys_with(finder: KeyFinder) -> KeyFinder:
    """Have :func:`dynamic_keys` ask ``finder`` too (a decorator)."""
    if finder not in _finders:
        _finders.append(finder)
    return finder


def dynamic_keys(client: redis.Redis, keys: SpiderKeys) -> dict[str, str]:
    """Keys named by the data: level lists, parked sites' lists, jobs, and those the
    packages above find (:func:`find_keys_with`): the dedup filter's."""
    found: dict[str, str] = {}
    for level in _members(client, keys.queue, "zset"):
        found[f"{keys.queue}:{level}"] = "list"
    for site in _members(client, keys.parked, "zset"):
        site_levels = f"{keys.parked}:{site}"
        found[site_levels] = "zset"
        for level in _members(client, site_levels, "zset"):
            found[f"{site_levels}:{level}"] = "list"
    for job in _members(client, keys.active_jobs, "set"):
        found[keys.job(job)] = "job"
    for finder in _finders:
        found.update(finder(client, keys))
    return found


def scan_keys(client: redis.Redis, match: str) -> Iterable[str]:
    """The keys matching ``match``, at most :data:`MAX_DYNAMIC_KEYS`, none moved aside."""
    for i, key in enumerate(client.scan_iter(match=match, count=1000)):
        if i >= MAX_DYNAMIC_KEYS:
            return
        if not text(key).endswith("~damaged"):
            yield text(key)


@dataclass
class Repair:
    """What one :func:`repair` did."""

    moved: list[str] = field(default_factory=list)
    jobs_ended: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.moved or self.jobs_ended)


# the refusal of a script that checks its keys first (core/lua/include/keytypes.lua)
REFUSAL = re.compile(r"WRONGTYPE damaged key (?P<key>.+): it should hold an? (?P<type>[\w ]+)$")
REFUSAL_TYPES = {
    "integer": "counter",
    "hash of positive numbers": "numbers",  # a dedup filter's parameters
    "list": "list",
    "zset": "zset",
    "hash": "hash",
    "set": "set",
    "string": "string",
}


def refused_key(error: Exception) -> dict[str, str]:
    """The key a script named when it refused the call, with its type; empty if none."""
    found = REFUSAL.search(str(error))
    if not found or found["type"] not in REFUSAL_TYPES:
        return {}
    return {found["key"]: REFUSAL_TYPES[found["type"]]}


def repair(client: redis.Redis, keys: SpiderKeys, named: dict[str, str] | None = None) -> Repair:
    """Move aside the spider's keys of the wrong type; end jobs whose counters are damaged.

    Two steps: the fixed keys first (a damaged index must not hide the lists it
    names), then the keys their contents name, with ``named`` (a key a refused
    script named: a list no index names any more, say).
    """
    done = Repair()
    for wanted in (fixed_keys(keys), {**dynamic_keys(client, keys), **(named or {})}):
        names, types = list(wanted), list(wanted.values())
        keys_ = [keys.stats, keys.job_prefix, *names]
        moved, ended = scripts.script(client, "repair")(keys=keys_, args=[len(names), *types])
        done.moved += [text(k) for k in moved]
        done.jobs_ended += [text(j) for j in ended]
    for key in done.moved:
        logger.error("key %s had the wrong type: moved aside to %s~damaged", key, key)
    for job in done.jobs_ended:
        logger.error("job %s had a counter that is not a number: ended closed (damaged)", job)
    return done


def owner(group: Sequence[SpiderKeys], key: str) -> SpiderKeys:
    """The spider of ``group`` whose key ``key`` is; the first (the caller's own) if none.

    Every spider of a group shares its hash tag, so one script's refusal may name a
    key of another spider: the one its requests are routed to, say.
    """
    for keys in group:
        names = (keys.queue, keys.dupefilter, keys.stats, keys.deadletter, keys.producer)
        if any(key == name or key.startswith(name + ":") for name in names):
            return keys
    return group[0]


_full_warned = [float("-inf")]  # when this process last said Redis is out of memory


def warn_full(error: Exception) -> None:
    """Redis refused a write for memory: said once per ``REPAIR_SECONDS`` a process, for
    every component that meets it (each spider's scheduler, stats, crawl state)."""
    now = time.monotonic()
    if now - _full_warned[0] >= REPAIR_SECONDS:
        _full_warned[0] = now
        logger.warning(
            "Redis is out of memory: nothing repaired, what was refused is kept and sent again: %s",
            error,
        )


class Repairer:
    """Calls :func:`repair` after a Redis error, at most once per ``REPAIR_SECONDS`` a spider.

    ``group`` holds the keys of every spider whose keys the caller's scripts touch
    (its own first: the spiders of its group, routed requests go to): a refusal
    that names a key repairs the spider that key is of; another error, all of them.
    """

    def __init__(
        self, client: redis.Redis, keys: SpiderKeys, group: Sequence[SpiderKeys] = ()
    ) -> None:
        self.client = client
        self.keys = keys
        self.group = [keys, *(other for other in group if other.spider != keys.spider)]
        self._last: dict[str, float] = {}

    def after(self, error: Exception, *, at_once: bool = False) -> Repair | None:
        """``error`` came back from a script of this spider: repair, unless just done
        (``at_once``: even so, when the refusal names its key, for a step that must not
        fail, such as opening; an error that names none is repaired at most as often)."""
        if isinstance(error, redis.ReadOnlyError):  # a failover under way: nothing damaged
            logger.warning("Redis is read-only (a failover?); kept, will retry: %s", error)
            return None
        if isinstance(error, redis.exceptions.OutOfMemoryError):  # full, not damaged
            warn_full(error)
            return None
        named = refused_key(error)
        spiders = [owner(self.group, next(iter(named)))] if named else self.group
        due = [keys for keys in spiders if self._due(keys.spider) or (at_once and named)]
        if not due:
            return None
        logger.error("Redis refused a script of %s: %s; repairing", self.keys.spider, error)
        done = Repair()
        for keys in due:
            found = self._repair(keys, named)
            done.moved += found.moved
            done.jobs_ended += found.jobs_ended
        return done

    def _due(self, spider: str) -> bool:
        """True, once per ``REPAIR_SECONDS`` for each spider."""
        now = time.monotonic()
        if now - self._last.get(spider, float("-inf")) < REPAIR_SECONDS:
            return False
        self._last[spider] = now
        return True

    def _repair(self, keys: SpiderKeys, named: dict[str, str]) -> Repair:
        try:
            return repair(self.client, keys, named)
        except redis.RedisError as exc:
            logger.error("repairing the keys of %s failed: %s", keys.spider, exc)
            return Repair()


def retried(repairer: Repairer, call: Callable[[], T], *, at_once: bool = False) -> T:
    """``call()``; refused for a damaged key, the key is repaired and ``call()`` sent once more.

    A script that refuses has written nothing (``core/lua/include/keytypes.lua``), so the
    second call does the whole work once. Sent again after a repair that found the key
    already moved too (another process met it first); raised again when the repair
    was not run (Redis read-only, or, unless ``at_once``, this spider repaired just before).
    """
    try:
        return call()
    except redis.ResponseError as exc:
        if repairer.after(exc, at_once=at_once) is None:
            raise
    return call()
