"""The worker registry: which processes host which spiders, and when each last beat.

Layout: ``<prefix>:workers`` (:func:`celery_crawl.core.keys.workers_key`), a sorted
set with one member per worker process that hosts crawlers: its JSON entry
(``id``, ``hostname``, ``pid``, ``spiders``, ``started``), scored with its last
heartbeat in unix ms, taken from the server's clock (``hosting/lua/worker_beat.lua``).

A process beats every ``CELERY_CRAWL_HEARTBEAT_SECONDS`` from a thread of its
own (:class:`WorkerRegistration`, run by :class:`celery_crawl.core.heartbeat.Heartbeat`),
and counts as live until it has missed three beats. A clean stop removes its
entry at once; a killed process's entry stays, shown as lost, for an hour.

Readers: ``celery-crawl status``, the exporter, and the job trackers, which
say "waiting: no live worker hosts <spider>" while that is so.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from celery_crawl.core import scripts
from celery_crawl.core.defaults import setting
from celery_crawl.core.keys import workers_key
from celery_crawl.core.repair import Repairer, retried
from celery_crawl.core.scripts import Argv

logger = logging.getLogger(__name__)

MISSED_BEATS = 3  # a process is live until it has missed this many beats
FORGET_AFTER = 3600.0  # seconds after its last beat that a lost process's entry is removed
BEAT = Argv("worker_beat", ("entry", "ms_forgotten"))
READ = Argv("workers_read")


@dataclass(frozen=True)
class WorkerInfo:
    """A registered worker process, as read back."""

    id: str
    hostname: str
    pid: int
    spiders: list[str]
    age: float  # seconds since its last beat
    live: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "hostname": self.hostname,
            "pid": self.pid,
            "spiders": self.spiders,
            "heartbeat_age": round(self.age, 1),
            "live": self.live,
        }


class WorkerRegistration:
    """One process's entry in the registry; :meth:`renew` stamps it, :meth:`unregister`
    removes it."""

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        spiders: Sequence[str],
        hostname: str = "",
        repairer: Repairer | None = None,
    ) -> None:
        self.client = client
        self.key = key
        # a registry of another type is refused (nothing written); moved aside, counted
        # with the first spider the process hosts, and the renewal sent again
        self.repairer = repairer
        hostname = hostname or socket.gethostname()
        pid = os.getpid()
        self.id = f"{hostname}/{pid}"
        self.entry = json.dumps(
            {
                "id": self.id,
                "hostname": hostname,
                "pid": pid,
                "spiders": sorted(spiders),
                "started": round(time.time(), 3),
            },
            separators=(",", ":"),
        )

    def renew(self) -> None:
        args = BEAT.build(entry=self.entry, ms_forgotten=int(FORGET_AFTER * 1000))
        beat = scripts.script(self.client, BEAT.script)
        if self.repairer is None:
            beat(keys=[self.key], args=args)
        else:
            retried(self.repairer, lambda: beat(keys=[self.key], args=args))

    def unregister(self) -> None:
        self.client.zrem(self.key, self.entry)


@dataclass(frozen=True)
class Registry:
    """Where the worker registry is, and how often its processes beat."""

    key: str
    heartbeat: float

    @classmethod
    def from_settings(cls, settings: Any) -> Registry:
        return cls(
            workers_key(setting(settings, "CELERY_CRAWL_KEY_PREFIX")),
            setting(settings, "CELERY_CRAWL_HEARTBEAT_SECONDS"),
        )

    def read(self, client: redis.Redis) -> list[WorkerInfo]:
        return read_workers(client, self.key, self.heartbeat)


def read_workers(client: redis.Redis, key: str, heartbeat: float) -> list[WorkerInfo]:
    """Every registered process, live or lost, with the age of its last beat (one round trip)."""
    now_ms, *flat = scripts.script(client, READ.script)(keys=[key], args=READ.build())
    found = []
    for member, score in zip(flat[::2], flat[1::2], strict=True):
        age = max(float(now_ms) - float(score), 0) / 1000
        worker = parse_entry(member, age, age < MISSED_BEATS * heartbeat)
        if worker is not None:
            found.append(worker)
    return sorted(found, key=lambda w: w.id)


def parse_entry(member: bytes, age: float, live: bool) -> WorkerInfo | None:
    """A registry entry read back; None, with a warning, for one that is not ours."""
    try:
        entry = json.loads(member)
        return WorkerInfo(
            id=str(entry["id"]),
            hostname=str(entry["hostname"]),
            pid=int(entry["pid"]),
            spiders=[str(s) for s in entry["spiders"]],
            age=age,
            live=live,
        )
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("ignored a malformed worker registry entry %r: %r", member[:80], exc)
        return None


def hosts(workers: Sequence[WorkerInfo], spider: str) -> list[WorkerInfo]:
    """The live processes that host ``spider``."""
    return [w for w in workers if w.live and spider in w.spiders]


def waiting_reason(workers: Sequence[WorkerInfo], spider: str) -> str:
    """What a job of ``spider`` waits for, or ``""`` when a live worker hosts it."""
    if hosts(workers, spider):
        return ""
    return f"waiting: no live worker hosts {spider}"
