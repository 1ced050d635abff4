"""The command line, run as a user would (the crawl command is tested with workers)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_site_subcommand_serves_the_demo_forum() -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "celery_crawl.cli",
        "site",
        "--port",
        str(port),
        "--forums",
        "2",
    ]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline, page = time.monotonic() + 30, None
        while page is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/list/00002/1", timeout=2
                ) as r:
                    page = json.loads(r.read())
            except OSError:
                time.sleep(0.1)
        assert page is not None and page["forum_id"] == "00002" and page["page"] == 1
    finally:
        server.terminate()
        server.wait(10)


def test_help_lists_the_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery_crawl.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert "crawl" in done.stdout and "site" in done.stdout
