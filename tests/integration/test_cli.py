"""The command line, run as a user would (the crawl command is tested with workers)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.ports import free_port


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


def test_demo_once_runs_everything_and_summarises(tmp_path: Path) -> None:
    """Embedded Valkey, demo site, a real worker, beat and Flower, then a summary.

    Run as installed, from a fresh folder outside the checkout that holds a
    ``tasks.py`` of its own: the demo still runs the bundled example.
    """
    import os

    from tasks.site import SiteConfig

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
    items = tmp_path / "items"
    (tmp_path / "tasks.py").write_text("raise ImportError('not the example')\n")
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("celery-crawl")),
            "demo",
            "--once",
            "--forums",
            "2",
            "--items",
            str(items),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    expected = SiteConfig(forums=2).expected()
    assert "password" in done.stdout and "Flower http://127.0.0.1:" in done.stdout
    assert f"│ items      │ {expected.posts + expected.comments}" in done.stdout
    assert f"│ pages      │ {expected.pages + expected.not_found}" in done.stdout
    lines = [line for f in items.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert len(lines) == expected.posts + expected.comments
