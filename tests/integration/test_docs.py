"""The Python examples of docs/ run as written, against real workers of the example app."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.workers import started_workers

DOCS = ["jobs.md"]


def python_blocks(page: str) -> list[str]:
    text = (ROOT / "docs" / page).read_text()
    return re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def examples() -> list[tuple[str, int]]:
    return [(page, i) for page in DOCS for i in range(len(python_blocks(page)))]


def test_every_page_listed_has_examples() -> None:
    assert all(python_blocks(page) for page in DOCS)


@pytest.mark.parametrize(("page", "index"), examples())
def test_the_example_runs_as_written(
    page: str, index: int, env: dict[str, str], tmp_path: Path
) -> None:
    # the example app's own feed layout (tasks/settings.py), in a folder of the test's
    feed = tmp_path / "items" / "%(job)s" / "%(name)s-%(worker)s.jsonl"
    env = {**env, "FORUM_FEED": str(feed)}
    with started_workers(env, tmp_path) as start_worker:
        start_worker(app="tasks", pool="solo")
        run_example(page, index, env, tmp_path)


def run_example(page: str, index: int, env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_blocks(page)[index])
    done = subprocess.run(
        [sys.executable, str(script)],
        check=False,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{page} example {index}:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
