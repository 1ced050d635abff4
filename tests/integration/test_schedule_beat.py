"""Sources on their own schedules, with a real ``celery beat``, a real worker and the demo site."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from celery_crawl.core.keys import SpiderKeys
from celery_crawl.producer.schedule import Schedule, Source
from tests.support.workers import WORKER_APP, Process, Worker, run_module, start_process

PERIOD = 1.0  # seconds between beat's ticks
RUN = 22.0  # seconds beat runs
LATE = PERIOD + 1.5  # a job starts at most this long after its source is due: a tick, and slack


def jobs_by_source(client: redis.Redis, keys: SpiderKeys) -> dict[str, list[dict[str, float]]]:
    """Every job of the spider, by its source: the job's field, which the producer sets
    (and which the test also gives each source as its ``source`` spider argument)."""
    found: dict[str, list[dict[str, float]]] = {}
    for key in client.scan_iter(match=keys.job_prefix + "*", count=1000):
        if client.type(key) != b"hash" or b":" in key[len(keys.job_prefix) :]:
            continue
        job = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
        if "created_at" not in job:
            continue
        source = job.get("source", "")
        assert source == json.loads(job.get("args", "{}")).get("source", ""), job
        times = {"start": float(job["created_at"]), "end": float(job.get("finished_at", "inf"))}
        times["reserved"] = float(job.get("reserved_at", "nan"))  # when a tick took its source
        found.setdefault(source, []).append(times)
    return {source: sorted(jobs, key=lambda j: j["start"]) for source, jobs in found.items()}


def beat(env: dict[str, str], folder: Path, period: float = PERIOD) -> Process:
    args = ["-A", WORKER_APP, "beat", "--loglevel", "INFO"]
    args += ["--schedule", str(folder / "beat-schedule")]
    ticking = {**env, "PRODUCER_PERIOD": str(period)}
    return start_process("celery", args, ticking, folder / "beat.log")


def test_beat_starts_each_source_on_its_own_schedule(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    forum_site: Any,
    prefix: str,
    state_client: redis.Redis,
    tmp_path: Path,
) -> None:
    """Due sources get a job within a tick of their due time, period after period; a paused
    one gets none; one added from the command line during the run gets one at its first tick."""
    keys = SpiderKeys.build("forum", prefix=prefix)
    schedule = Schedule(state_client, keys)
    intervals = {"every5": 5.0, "every9": 9.0}
    for (source, interval), forum in zip(intervals.items(), ("00001", "00002"), strict=True):
        schedule.put(Source(source, [{"forum_id": forum}], interval, args={"source": source}))
    paused = Source("paused", [{"forum_id": "00003"}], 2.0, args={"source": "paused"})
    schedule.put(paused, paused=True)
    start_worker()
    ticking = beat(env, tmp_path)
    try:
        # from beat's start, which its app's imports and first connection take on a busy machine
        started = wait_for(lambda: "beat: Starting" in (tmp_path / "beat.log").read_text(), 60)
        assert started, (tmp_path / "beat.log").read_text()[-2000:]
        began = time.time()
        time.sleep(RUN / 3)
        seed = '{"forum_id": "00003"}'
        args = ["sources", "add", "forum", "added", "--seed", seed, "--interval", "60"]
        args += ["--arg", "source=added", "-A", WORKER_APP]
        added = run_module("celery_crawl.tools.cli", args, env, timeout=60)
        assert added.returncode == 0, added.stderr
        added_at = time.time()  # added by then; its job starts at the next tick
        time.sleep(max(began + RUN - time.time(), 0))
    finally:
        ticking.terminate()
        ticking.wait(30)
    log = (tmp_path / "beat.log").read_text()[-2000:]
    jobs = jobs_by_source(state_client, keys)
    assert "paused" not in jobs
    assert len(jobs.get("added", [])) == 1, log
    assert jobs["added"][0]["start"] - added_at <= LATE
    stopped = began + RUN
    for source, interval in intervals.items():
        starts = jobs.get(source, [])
        assert len(starts) >= 2, (source, starts, log)  # period after period
        assert starts[0]["start"] - began <= LATE + 5  # beat's first tick, a few seconds
        # none missing at the end: the last job's successor was not due yet when beat stopped
        # (a job that outlasts its interval makes its source due when it ends)
        last = starts[-1]
        assert max(last["start"] + interval, last["end"]) + LATE >= stopped, (source, starts, log)
        for before, after in itertools.pairwise(starts):
            due = max(before["start"] + interval, before["end"])  # start to start, once ended
            assert after["start"] <= due + LATE, (source, starts)
            # never early: due an interval after the last reservation, whose time is kept to
            # the second; a job is created a little after its reservation
            assert int(before["reserved"]) + interval <= after["reserved"], (source, starts)
            assert after["reserved"] <= after["start"], (source, starts)


def test_beat_syncs_the_sources_file_when_it_changes(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    forum_site: Any,
    prefix: str,
    state_client: redis.Redis,
    tmp_path: Path,
) -> None:
    """PRODUCER_SOURCES_FILE: editing the file is the deploy. A source in it gets a job; one
    added to it gets one at the next tick; one paused in it gets no more."""
    keys = SpiderKeys.build("forum", prefix=prefix)
    path = tmp_path / "sources.yaml"
    entry = (
        '  - {{id: {0}, seeds: [{{forum_id: "{1}"}}], interval: {2},'
        " adaptive: false, args: {{source: {0}}}}}\n"
    )
    first = entry.format("first", "00001", 2)  # due every 2 s: paused, it would show at once
    path.write_text("forum:\n" + first)
    env = {**env, "PRODUCER_SOURCES_FILE": str(path)}
    start_worker(extra_env=env)
    ticking = beat(env, tmp_path)
    try:
        assert wait_for(lambda: "first" in jobs_by_source(state_client, keys), 30)
        changed = first.replace("}\n", ", paused: true}\n")
        path.write_text("forum:\n" + changed + entry.format("second", "00002", 60))
        edited_at = time.time()
        assert wait_for(lambda: "second" in jobs_by_source(state_client, keys), 30)
        time.sleep(4 * PERIOD + 2)  # ticks after the edit: "first" gets no job
    finally:
        ticking.terminate()
        ticking.wait(30)
    jobs = jobs_by_source(state_client, keys)
    assert jobs["second"][0]["start"] - edited_at <= LATE
    assert len(jobs["second"]) == 1
    # a tick under way at the edit may start one more of "first"; none after the next
    assert not [job for job in jobs["first"] if job["start"] > edited_at + LATE], jobs["first"]
    paused = Schedule(state_client, keys).get("first")
    assert paused is not None and paused.paused


def wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()
