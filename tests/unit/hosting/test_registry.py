"""The worker registry on a real server: beats, ages, leaving, and entries that are not ours."""

from __future__ import annotations

import time

import redis

from celery_crawl.core.keys import workers_key
from celery_crawl.hosting.registry import Registry, WorkerRegistration, waiting_reason


def test_a_beating_process_is_live_and_hosts_its_spiders(client: redis.Redis, prefix: str) -> None:
    registry = Registry(workers_key(prefix), heartbeat=5.0)
    beat = WorkerRegistration(client, registry.key, ["paths", "forum"], "w1@host")
    beat.renew()
    (worker,) = registry.read(client)
    assert (worker.id, worker.spiders, worker.live) == (beat.id, ["forum", "paths"], True)
    assert worker.age < 5.0
    assert waiting_reason([worker], "paths") == ""
    assert waiting_reason([worker], "other") == "waiting: no live worker hosts other"
    beat.unregister()
    assert registry.read(client) == []


def test_a_process_that_stopped_beating_is_lost(client: redis.Redis, prefix: str) -> None:
    registry = Registry(workers_key(prefix), heartbeat=5.0)
    beat = WorkerRegistration(client, registry.key, ["paths"], "w2@host")
    client.zadd(registry.key, {beat.entry: 1})  # its last beat, long ago
    (worker,) = registry.read(client)
    assert not worker.live
    assert waiting_reason([worker], "paths") == "waiting: no live worker hosts paths"


def test_entries_that_are_not_ours_are_skipped(client: redis.Redis, prefix: str) -> None:
    registry = Registry(workers_key(prefix), heartbeat=5.0)
    WorkerRegistration(client, registry.key, ["paths"], "w3@host").renew()
    now_ms = int(time.time() * 1000)  # recent: no beat prunes them before the read
    client.zadd(registry.key, {b"not json": now_ms, b'{"id": 1}': now_ms, b"[]": now_ms})
    assert client.zcard(registry.key) == 4
    assert [w.hostname for w in registry.read(client)] == ["w3@host"]
