"""The Python examples of docs/ run as written, against real workers of the example app."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.workers import Worker

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
    page: str, index: int, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    start_worker(app="tasks", pool="solo")
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
