"""Free loopback ports for the servers the tests start."""

from __future__ import annotations

import socket


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
