"""``kill -9`` of one of two workers mid-crawl: every item of every page is in some feed file.

Two workers host ``paths_jobs`` (tests/support/job_hooks.py), whose feed is
JSON lines, a file per job and process. One job crawls 48 trees of the paths
site (1,488 pages, one item per page, the page's path); one worker is killed
with SIGKILL mid-crawl. The pages it held are crawled again by the other; the
pages it had acked are not, so their items must already be in its file. The
test counts items by their path (duplicates allowed: at least once).
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_crawl import crawl
from tests.support.paths_spider import PathsSite, children_of
from tests.support.workers import Worker, started_workers

TREES = 48
KILL_AFTER_PAGES = 500


@pytest.fixture(params=["file", "folder"])
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    """FEED_TEMPDIR: where remote feeds are spooled."""
    folder = tmp_path / "feed-tmp"
    folder.mkdir()
    return folder


@pytest.fixture
def workers(
    env: dict[str, str], feeds: Path, spool: Path, scheme: str, paths_site: PathsSite
) -> Iterator[Callable[..., Worker]]:
    values = {
        **env,
        "JOB_FEED_DIR": str(feeds),
        "JOB_FEED_SCHEME": scheme,
        "FEED_TEMPDIR": str(spool),
    }
    with started_workers(values, spool.parent) as start:
        yield start


def tree_paths(name: str) -> set[str]:
    """Every page of the tree ``name``: the item each of them yields."""
    found, todo = set(), [f"/tree/{name}/r"]
    while todo:  # bounded: the tree has 2**TREE_LEVELS - 1 pages
        path = todo.pop()
        found.add(path)
        todo.extend(children_of(path))
    return found


def feed_items(parts: list[Path]) -> Counter[str]:
    """The paths in the feed files; a killed worker's last line may be cut off, and is skipped."""
    items: Counter[str] = Counter()
    for part in parts:
        *complete, _cut = part.read_text().split("\n")
        items.update(json.loads(line)["path"] for line in complete)
    return items


def test_a_killed_workers_acked_pages_have_their_items_in_its_feed(
    app: Celery, workers: Callable[..., Worker], feeds: Path, spool: Path
) -> None:
    victim = workers("victim", pool="solo", concurrency=1)
    workers("survivor", pool="solo", concurrency=1)
    names = [f"t{n:02d}" for n in range(TREES)]
    job = crawl("paths_jobs", [{"tree": name} for name in names], app=app)
    deadline = time.monotonic() + 60
    while job.status().pages < KILL_AFTER_PAGES and time.monotonic() < deadline:
        time.sleep(0.02)
    victim.signal(signal.SIGKILL)
    victim.proc.wait(10)
    result = job.wait(timeout=180)
    expected = set().union(*(tree_paths(name) for name in names))
    assert result["state"] == "done", result
    items = feed_items(sorted(feeds.glob(f"{job.id}-*.jsonl")))
    missing = expected - set(items)
    assert not missing, f"{len(missing)} of {len(expected)} items in no feed file"
    assert set(items) == expected
    (victim_part,) = feeds.glob(f"{job.id}-*-{victim.proc.pid}.jsonl")
    assert not list(spool.rglob("*.part")), "spool files left behind"
    print(
        f"{len(expected)} items, {sum(items.values()) - len(expected)} more than once;"
        f" the killed worker's part held {len(feed_items([victim_part]))}"
    )


def test_a_worker_that_starts_stores_the_spool_files_dead_processes_left(
    env: dict[str, str], tmp_path: Path, paths_site: PathsSite
) -> None:
    """A spool file whose job ended elsewhere (no process here finishes it) is stored by the
    next worker of the host whose crawler opens, to the URI its record names."""
    feeds, spool = tmp_path / "job-feeds", tmp_path / "feed-tmp" / "celery_crawl-feeds"
    feeds.mkdir()
    spool.mkdir(parents=True, mode=0o700)
    template = f"folder://{feeds}/%(job)s-%(worker)s.jsonl"  # paths_jobs' remote feed
    left = feeds / "ended-job-host-1.jsonl"
    (spool / "left.part").write_bytes(b'{"path": "/tree/x/r"}\n{"path": "/tree/x/ra"}\n{"pa')
    record = {"uri": f"folder://{left}", "template": template, "job": "ended-job"}
    (spool / "left.json").write_text(json.dumps(record))
    values = {
        **env,
        "JOB_FEED_DIR": str(feeds),
        "JOB_FEED_SCHEME": "folder",
        "FEED_TEMPDIR": str(spool.parent),
    }
    with started_workers(values, tmp_path) as start:
        start("restarted", pool="solo", concurrency=1)
        deadline = time.monotonic() + 30
        while (spool / "left.part").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert left.read_bytes() == b'{"path": "/tree/x/r"}\n{"path": "/tree/x/ra"}\n{"pa'
    assert not list(spool.iterdir()), "spool files left behind"
