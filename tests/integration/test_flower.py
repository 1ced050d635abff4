"""Flower, run for real against real workers, shows jobs and revokes them cooperatively."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_crawl import crawl
from tests.support import ROOT
from tests.support.ports import free_port
from tests.support.waiting import wait_for_value
from tests.support.workers import WORKER_APP, Worker

AUTH = "Basic " + base64.b64encode(b"test:secret").decode()


class Flower:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            WORKER_APP,
            "flower",
            "--address=127.0.0.1",
            f"--port={self.port}",
        ]
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**env, "FLOWER_BASIC_AUTH": "test:secret"},  # as documented: not in argv
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )

    def call(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method, headers={"Authorization": AUTH}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read() or b"null")

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.call("/api/workers?refresh=1")
                return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("Flower did not start")

    def task(self, task_id: str) -> dict[str, Any] | None:
        try:
            return self.call(f"/api/task/info/{task_id}")  # type: ignore[no-any-return]
        except urllib.error.HTTPError:
            return None


@pytest.fixture
def flower(env: dict[str, str], tmp_path: Path) -> Iterator[Flower]:
    server = Flower(env, tmp_path / "flower.log")
    server.wait_ready()
    yield server
    server.proc.terminate()
    server.proc.wait(10)


def test_flower_takes_its_password_from_the_environment(flower: Flower) -> None:
    assert "secret" not in " ".join(
        Path(f"/proc/{flower.proc.pid}/cmdline").read_text().split("\0")
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{flower.port}/api/workers", timeout=5)
    assert refused.value.code == 401
    assert flower.call("/api/workers") is not None


def in_state(state: str) -> Callable[[dict[str, Any]], bool]:
    """A check of Flower's view of a task: in ``state``."""
    return lambda task: task.get("state") == state


def test_flower_shows_args_progress_and_result(
    app: Celery,
    start_worker: Callable[..., Worker],
    flower: Flower,
) -> None:
    start_worker()
    job = crawl("paths", [{"chain": "a", "length": 8}], app=app)
    running = wait_for_value(lambda: flower.task(job.id), in_state("PROGRESS"), 30, "PROGRESS")
    assert "'paths'" in running["args"] and "'chain': 'a'" in running["args"]
    assert running["name"] == "celery_crawl.crawl"
    result = job.wait(timeout=60)
    done = wait_for_value(lambda: flower.task(job.id), in_state("SUCCESS"), 30, "SUCCESS")
    assert f"'pages': {result['pages']}" in str(done["result"])


def test_revoke_from_flower_cancels_the_job_and_kills_no_process(
    app: Celery,
    start_worker: Callable[..., Worker],
    flower: Flower,
) -> None:
    worker = start_worker()
    job = crawl("paths", [{"chain": "b", "length": 40}], app=app)
    wait_for_value(lambda: flower.task(job.id), in_state("PROGRESS"), 30, "PROGRESS")
    children = worker_children(worker.proc.pid)
    flower.call(f"/api/task/revoke/{job.id}?terminate=true", method="POST")
    result = job.wait(timeout=30)
    assert result["state"] == "cancelled"
    assert result["pages"] < 40
    assert worker_children(worker.proc.pid) == children  # no pool process was killed
    assert worker.proc.poll() is None


def worker_children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(p) for p in path.read_text().split()}
