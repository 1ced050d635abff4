"""Small helpers for tests: loopback ports, and programs from Debian's packages."""

from __future__ import annotations

import os
import shutil
import socket

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def debian_tool(name: str, package: str) -> str:
    """The path of ``name``; .ci/run installs ``package``, so under CI a missing one fails.

    Elsewhere the test is skipped, with the package to install as the reason.
    """
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} not installed: .ci/run must apt-get install {package}")
        pytest.skip(f"{name} not installed (apt-get install {package})")
    return path
