"""The Python examples of the README and docs/ run as written, against real workers.

A ```python block is an example that runs: this test runs each one, in a
process of its own, with a worker of the example app. A fragment that cannot
run alone (a settings file, a class body) is a ```py block.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.workers import run_script, started_workers

PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
# the pages whose examples must exist: the front door, and the job lifecycle
MUST_HAVE_EXAMPLES = ["README.md", "docs/jobs.md"]


def python_blocks(page: str) -> list[str]:
    text = (ROOT / page).read_text()
    return re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def examples() -> list[tuple[str, int]]:
    return [(page, i) for page in PAGES for i in range(len(python_blocks(page)))]


def test_the_pages_that_need_examples_have_them() -> None:
    assert all(python_blocks(page) for page in MUST_HAVE_EXAMPLES)


def test_every_page_starts_with_what_a_reader_gets() -> None:
    for page in PAGES[1:]:
        if page == "docs/settings.md":  # generated: it opens with its own summary
            continue
        first = (ROOT / page).read_text().split("\n\n")[1]
        assert first.startswith("What you get from this page:"), page


@pytest.mark.parametrize(("page", "index"), examples())
def test_the_example_runs_as_written(
    page: str, index: int, env: dict[str, str], tmp_path: Path
) -> None:
    # the example app's own feed layout (celery_crawl/demo/settings.py), in a folder of the test's
    feed = tmp_path / "items" / "%(job)s" / "%(name)s-%(worker)s.jsonl"
    env = {**env, "FORUM_FEED": str(feed)}
    with started_workers(env, tmp_path) as start_worker:
        start_worker(app="tasks", pool="solo")
        run_example(page, index, env, tmp_path)


def run_example(page: str, index: int, env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_blocks(page)[index])
    done = run_script(script, env, timeout=180)
    assert done.returncode == 0, f"{page} example {index}:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_relative_link_reaches_a_file_and_heading() -> None:
    broken = []
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists():
                broken.append(f"{page}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
                if anchor not in {slug(h) for h in headings}:
                    broken.append(f"{page}: {target} (no such heading)")
    assert not broken, broken
