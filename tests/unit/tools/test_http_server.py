"""The exporter's server, on a real port over a real Redis: idle, slow and bad clients cost it
a bounded number of threads and connections, and a scrape is still answered."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import redis

from celery_crawl.core.keys import SpiderKeys
from celery_crawl.tools import http_server
from celery_crawl.tools.exporter import serve
from tests.support.ports import free_port

IDLE = 150  # more than the server keeps waiting, and than any pool


@pytest.fixture
def exporter(client: redis.Redis, prefix: str) -> Iterator[int]:
    client.hset(SpiderKeys.build("forum", prefix=prefix).stats, "item_scraped_count", 3)
    port = free_port()
    server, _ = serve(client, [SpiderKeys.build("forum", prefix=prefix)], port, "127.0.0.1")
    yield port
    server.shutdown()


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
        return str(reply.read().decode())


@contextlib.contextmanager
def held_open(port: int, count: int, send: bytes = b"") -> Iterator[list[socket.socket]]:
    """``count`` connections that send ``send`` (a request head cut short) and then nothing."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]
    try:
        for sock in socks:
            sock.sendall(send)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.alone  # answered within bounds
def test_idle_connections_cost_no_thread_and_a_scrape_is_still_answered(exporter: int) -> None:
    """Before: a thread per connection (150 more threads), none ever closed."""
    before = threading.active_count()
    with (
        held_open(exporter, IDLE // 2),
        held_open(exporter, IDLE // 2, b"GET /metrics HTTP/1.1\r\n"),
    ):
        time.sleep(0.5)  # all accepted
        assert threading.active_count() - before <= http_server.THREADS + 1
        started = time.monotonic()
        assert 'celery_crawl_items_total{spider="forum"} 3.0' in scrape(exporter)
        assert time.monotonic() - started < 5
        assert threading.active_count() - before <= http_server.THREADS + 1


@pytest.mark.alone  # closed within bounds
def test_a_connection_that_sends_no_request_is_closed_after_the_time_out(exporter: int) -> None:
    with held_open(exporter, 3, b"GET /met") as socks:
        started = time.monotonic()
        assert all(closed_by_server(sock) for sock in socks)  # the client waits up to 30 s
        assert time.monotonic() - started < http_server.REQUEST_SECONDS + 5


def test_the_server_answers_bad_requests_and_other_paths(exporter: int) -> None:
    with pytest.raises(urllib.error.HTTPError) as missing:
        scrape(exporter, "/other")
    assert missing.value.code == 404
    assert "celery_crawl_items_total" in scrape(exporter, "/metrics?name[]=x")
    with socket.create_connection(("127.0.0.1", exporter), timeout=10) as sock:
        sock.sendall(b"\x00\x01 nonsense\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400 ")
