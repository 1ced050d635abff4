"""Items per job: open_job/close_job, job_finished, and %(job)s feeds complete when wait() returns.

Real worker processes host ``paths_jobs`` (``tests/support/job_hooks.py``),
whose pipeline records its per-job hooks and whose feed is
``<job>-<worker>.jsonl``: one file per job and process.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_crawl import crawl
from tests.support.paths_spider import TREE_LEVELS, PathsSite, children_of
from tests.support.workers import Worker, started_workers

TREE_PAGES = 2**TREE_LEVELS - 1
# children of the fan page in the cancel test: when it cancels, about 50 of them are done,
# downloading or prefetched (49 to 51 of 240 in three runs, one beside two CPU hogs),
# whatever their number; of 120, a suite run once left 59 queued, not more than half
WIDTH = 240


@pytest.fixture
def workers(
    env: dict[str, str], feeds: Path, tmp_path: Path, paths_site: PathsSite
) -> Iterator[Callable[..., Worker]]:
    with started_workers({**env, "JOB_FEED_DIR": str(feeds)}, tmp_path) as start:
        yield start


def lines(files: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for path in files for line in path.read_text().splitlines()]


def events(feeds: Path) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """(process, job) -> the hooks it ran for that job, in order."""
    found = defaultdict(list)
    for event in lines(sorted(feeds.glob("events-*.jsonl"))):
        found[(event["pid"], event["job"])].append(event)
    return found


def test_a_jobs_feed_is_complete_and_its_hooks_ran_in_order_when_wait_returns(
    app: Celery, workers: Callable[..., Worker], feeds: Path
) -> None:
    workers("one", pool="solo", concurrency=1)
    job = crawl("paths_jobs", [{"tree": "solo"}], app=app)
    result = job.wait(timeout=60)
    assert result["state"] == "done" and result["items"] == TREE_PAGES
    (feed,) = feeds.glob(f"{job.id}-*.jsonl")  # read at once: wait() returned after it was stored
    paths = [item["path"] for item in lines([feed])]
    assert len(paths) == len(set(paths)) == TREE_PAGES
    assert all(path.startswith("/tree/solo/") for path in paths)
    ((_, job_id), hooks), *_ = events(feeds).items()
    assert job_id == job.id
    assert [(e["event"], e.get("seen"), e.get("items")) for e in hooks] == [
        ("open_job", 0, None),  # before any item of the job
        ("close_job", TREE_PAGES, None),  # after every item went through the pipeline
        ("job_finished", None, TREE_PAGES),  # then the signal, with the job's stats
    ]


def test_two_jobs_on_two_processes_each_get_their_own_complete_feed_parts(
    app: Celery, workers: Callable[..., Worker], feeds: Path
) -> None:
    """Prefork, 2 processes, two jobs at once: each job's parts hold its items, and only them."""
    workers("pair", pool="prefork", concurrency=2)
    jobs = {name: crawl("paths_jobs", [{"tree": name}], app=app) for name in ("left", "right")}
    for name, job in jobs.items():
        result = job.wait(timeout=90)
        assert result["state"] == "done" and result["items"] == TREE_PAGES
        parts = sorted(feeds.glob(f"{job.id}-*.jsonl"))
        paths = [item["path"] for item in lines(parts)]
        assert sorted(paths) == sorted(set(paths)) and len(paths) == TREE_PAGES, parts
        assert all(path.startswith(f"/tree/{name}/") for path in paths)
        hooks = {pid: found for (pid, job_id), found in events(feeds).items() if job_id == job.id}
        assert {e["event"] for found in hooks.values() for e in found} == {
            "open_job",
            "close_job",
            "job_finished",
        }
        closes = [e for found in hooks.values() for e in found if e["event"] == "close_job"]
        assert sum(e["seen"] for e in closes) == TREE_PAGES  # in one pipeline or the other
    pids = {pid for pid, _ in events(feeds)}
    print(f"processes that worked on the jobs: {len(pids)}")


def test_a_closed_jobs_feed_holds_what_its_pages_yielded(
    app: Celery, workers: Callable[..., Worker], feeds: Path
) -> None:
    """A job that ends early: its in-flight pages finish, then its part is closed."""
    workers("closing", pool="solo", concurrency=1)
    job = crawl("paths_jobs", [{"tree": "cut"}], app=app, limits={"pages": 5})
    result = job.wait(timeout=60)
    assert result["state"] == "closed" and result["reason"] == "closespider_pagecount"
    (feed,) = feeds.glob(f"{job.id}-*.jsonl")
    assert len(lines([feed])) == result["items"] >= 5


def test_under_the_spider_scope_a_cancelled_jobs_purged_pages_are_crawled_by_the_next_job(
    app: Celery, workers: Callable[..., Worker], paths_site: PathsSite
) -> None:
    """Cancel purges the queued children and takes their fingerprints out of the filter."""
    workers("cancel", pool="solo", concurrency=1)
    first = crawl("paths_jobs", [{"fan": "c", "width": WIDTH}], app=app)
    deadline = time.monotonic() + 30
    while first.status().pages < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    purged = first.cancel()
    assert purged > WIDTH // 2, purged  # 1 s downloads (FAN_SECONDS): most still queued
    ended = first.wait(timeout=60)
    assert ended["state"] == "cancelled"
    children = children_of(f"/fan/c/{WIDTH}")
    fetched_first = sum(paths_site.hits[path] for path in children)
    again = crawl("paths_jobs", [{"fan": "c", "width": WIDTH}], app=app).wait(timeout=60)
    assert again["state"] == "done"
    assert again["pages"] == 1 + purged  # the seed, and exactly what the first job left
    assert all(paths_site.hits[path] == 1 for path in children)
    assert fetched_first == WIDTH - purged
