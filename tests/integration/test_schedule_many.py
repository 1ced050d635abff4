"""A thousand sources of two spiders on their own schedules, with a real ``celery beat``.

Each source is due its interval after its last job's reservation; every tick of beat
must reserve every source due, so each source is served by the first tick after its
due time, period after period, and every job ends with its page crawled. Each job
records when its source was due and when its tick reserved it (``due_at``,
``reserved_at``), which is what the test reads.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_crawl.core.keys import SpiderKeys
from celery_crawl.demo.site import SiteConfig, run_in_thread
from celery_crawl.producer.schedule import Schedule, Source, splay_seconds
from tests.integration.test_schedule_beat import beat
from tests.support.workers import Worker

PERIOD = 2.0  # seconds between beat's ticks
RUN = 75.0  # seconds beat runs: several periods of every interval
# each spider's sources, half at each interval (s)
INTERVALS = {"forum": (20.0, 40.0), "paths": (30.0, 60.0)}
PER_SPIDER = 500
# A source due at t is reserved by the first tick after t: within PERIOD, plus the
# time beat's message takes to reach a free worker process (PICKUP), which a loaded
# 2-core machine stretches. The tick then creates its jobs one after another, within
# the tick's own work: read from the worker's log, it must stay small (the median tick
# within half a period, the longest within two).
PICKUP = 1.5
STARTUP = 5.0  # seconds from starting beat to its first tick
TICK = re.compile(r"celery_crawl\.produce\[[^]]+\] succeeded in ([0-9.]+)s")


@pytest.fixture
def forum_site() -> Iterator[Any]:
    """A forum of 500 empty boards: a job of one fetches its list page."""
    with run_in_thread(SiteConfig(forums=PER_SPIDER, posts_per_forum=0)) as site:
        yield site


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """The workers' and beat's environment: both spiders produced, and room for every job."""
    return {**env, "PRODUCER_SPIDERS": ",".join(INTERVALS), "PRODUCER_JOB_CAP": str(2 * PER_SPIDER)}


def sources_of(spider: str) -> list[Source]:
    """Half of ``spider``'s sources at each of its intervals; each one page to crawl."""
    found = []
    for n in range(PER_SPIDER):
        interval = INTERVALS[spider][n % 2]
        seed: dict[str, str] = {"forum_id": f"{n + 1:05d}"}
        if spider == "paths":
            seed = {"probe": f"s{n}"}
        found.append(Source(f"{spider}-{n}", [seed], interval, args={"source": f"{spider}-{n}"}))
    return found


def jobs_of(client: redis.Redis, keys: SpiderKeys) -> dict[str, list[dict[str, Any]]]:
    """Every job of the spider by source, in reservation order, read in pipelined batches."""
    names = [
        key
        for key in client.scan_iter(match=keys.job_prefix + "*", count=1000)
        if b":" not in key[len(keys.job_prefix) :]
    ]
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hgetall(name)
        hashes = pipe.execute(raise_on_error=False)
    found: dict[str, list[dict[str, Any]]] = {}
    for job in hashes:
        if not isinstance(job, dict) or b"created_at" not in job:
            continue
        fields: dict[str, Any] = {k.decode(): v.decode() for k, v in job.items()}
        for name in ("created_at", "due_at", "reserved_at"):
            fields[name] = float(fields[name])
        found.setdefault(fields["source"], []).append(fields)
    return {source: sorted(jobs, key=lambda j: j["reserved_at"]) for source, jobs in found.items()}


def wait_until_ended(client: redis.Redis, keys: list[SpiderKeys], timeout: float) -> None:
    """Bounded: until no job of ``keys`` runs any more (the last tick's jobs finishing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [j["state"] for k in keys for js in jobs_of(client, k).values() for j in js]
        if states and all(state != "running" for state in states):
            return
        time.sleep(1.0)


# a tick's jobs within their due time: the whole machine. With a CPU of its own and the
# other tests idle beside it, its longest tick measured 4.6 to 6.2 s in CI (alone on an
# idle machine: 0.59 s), and it failed twice in a row in two suite runs of eight
@pytest.mark.alone(machine=True)
# the ticks' work is a time measured on a shared machine: a failed measurement is taken
# again, twice at most, as the politeness rates are (pytest-rerunfailures; reruns are
# listed); on a day the machine ran slow it failed on the code before this change too
@pytest.mark.flaky(reruns=2)
def test_a_thousand_sources_of_two_spiders_each_start_within_a_tick_of_due(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    forum_site: Any,
    prefix: str,
    state_client: redis.Redis,
    tmp_path: Path,
) -> None:
    """1,000 sources, four intervals from 20 to 60 s, two spiders: over 75 s every source
    is served at each due time by the first tick after it, never before it; each tick's
    jobs are created within the tick's work; every job crawls its page."""
    keys = {spider: SpiderKeys.build(spider, prefix=prefix) for spider in INTERVALS}
    start_worker()
    put_at = time.time()
    for spider, spider_keys in keys.items():
        schedule = Schedule(state_client, spider_keys)
        for source in sources_of(spider):  # first due across its interval, not all now
            schedule.put(source, splay=True)
    ticking = beat(env, tmp_path, PERIOD)
    try:
        began = time.time()
        time.sleep(RUN)
    finally:
        ticking.terminate()
        ticking.wait(30)
    wait_until_ended(state_client, list(keys.values()), timeout=60)
    stopped = began + RUN
    log = (tmp_path / "beat.log").read_text()[-2000:]
    ticks = [float(seconds) for seconds in TICK.findall((tmp_path / "w1.log").read_text())]
    assert len(ticks) >= RUN / PERIOD, ticks  # both spiders' ticks, every period
    work = max(ticks)
    assert statistics.median(ticks) <= PERIOD / 2 and work <= 2 * PERIOD, ticks
    waits, creations = [], []  # due to reservation; reservation to the job's creation
    for spider, spider_keys in keys.items():
        jobs = jobs_of(state_client, spider_keys)
        # the spider's ticks, as its reservations show them (every tick reserves some)
        tick_times = sorted({job["reserved_at"] for js in jobs.values() for job in js})
        for source in sources_of(spider):
            starts = jobs.get(source.id, [])
            assert starts, (source.id, log)
            first_due = put_at + splay_seconds(source)
            assert first_due - 0.01 <= starts[0]["due_at"] <= began + splay_seconds(source)
            for number, job in enumerate(starts):
                assert job["state"] == "done" and int(job["done"]) == 1, (source.id, job)
                due, reserved = job["due_at"], job["reserved_at"]
                if number:  # start to start, from the last reservation's whole second
                    expected = int(starts[number - 1]["reserved_at"]) + source.interval
                    assert abs(due - expected) < 0.002, (source.id, starts)
                assert due <= reserved <= job["created_at"], (source.id, job)  # never early
                # served by the first tick after its due time: no tick in between
                assert not [t for t in tick_times if due <= t < reserved], (source.id, job)
                late_from = max(due, began + STARTUP)  # due while beat starts: its first tick
                waits.append((reserved - late_from, source.id, due - began, reserved - began))
                creations.append(job["created_at"] - reserved)
            # none missing: its next due time had not come a tick before beat stopped
            next_due = int(starts[-1]["reserved_at"]) + source.interval
            assert next_due + PERIOD + PICKUP >= stopped, (source.id, starts)
    waits.sort()
    creations.sort()
    worst = [f"{s} due {d:.2f} reserved {r:.2f}" for _, s, d, r in waits[-5:]]
    print(f"{len(waits)} jobs; due to reserved: median {waits[len(waits) // 2][0]:.2f} s,")
    print(f"most {waits[-1][0]:.2f} s; reserved to created: median")
    print(f"{statistics.median(creations):.2f} s, most {creations[-1]:.2f} s;")
    print(f"{len(ticks)} ticks, median {statistics.median(ticks):.2f} s, longest {work:.2f} s")
    # every source reserved within a tick of due
    assert waits[-1][0] <= PERIOD + PICKUP, (worst, f"ticks from {tick_times[0] - began:.2f}")
    assert creations[-1] <= work  # and its job created within its tick's work
