"""``kill -9`` at each step of a request's life: every page fetched, items at least once.

A worker crawls the 31-page tree of the paths site with the ``fault_tree``
spider, whose hook stops the first process that reaches the step with the
trigger page (tests/support/fault_spider.py). The test kills that worker's
whole process group with SIGKILL, starts another worker, and checks that the
job is done with every page fetched, every item scraped at least once, and
how often the trigger page was fetched: the repeat each step costs.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_crawl import crawl
from tests.support.paths_spider import TREE_LEVELS, PathsSite
from tests.support.waiting import wait_for
from tests.support.workers import Worker

PAGES = 2**TREE_LEVELS - 1
# step -> how often the trigger page is fetched in all: the kill's repeat
FETCHES = {
    "after_lease": 1,  # leased, not downloaded yet: fetched once, by the second worker
    "during_download": 2,  # the first download never finished
    "after_parse": 2,  # parsed, its children still in the buffer: lost, so parsed again
    "after_flush": 2,  # its children in Redis, its ack not: fetched again, children dups
}


def tree_hits(site: PathsSite, name: str) -> dict[str, int]:
    return {path: n for path, n in site.hits.items() if path.startswith(f"/tree/{name}/")}


@pytest.mark.parametrize("step", [*FETCHES, "warm_shutdown"])
def test_a_worker_killed_at_each_step_loses_nothing(
    step: str,
    env: dict[str, str],
    app: Celery,
    start_worker: Callable[..., Worker],
    paths_site: PathsSite,
    tmp_path: Path,
) -> None:
    name = step.replace("_", "-")
    trigger = f"/tree/{name}/rab"  # two levels down, with children of its own
    marker = tmp_path / "stopped"
    env.update(FAULT_STEP=step, FAULT_TRIGGER=trigger, FAULT_MARKER=str(marker))
    if step == "during_download":
        paths_site.hold_first[trigger] = 120.0
    first = start_worker("first")
    job = crawl("fault_tree", [{"tree": name}], app=app)
    if step == "warm_shutdown":
        wait_for(lambda: sum(tree_hits(paths_site, name).values()) >= 8, 30, "8 pages")
        first.proc.send_signal(signal.SIGTERM)  # a warm shutdown, which stops in its middle
    reached: Callable[[], bool] = marker.exists
    if step == "during_download":
        reached = lambda: paths_site.hits[trigger] >= 1  # noqa: E731
    wait_for(reached, 30, step)
    first.signal(signal.SIGKILL)
    first.proc.wait(10)

    start_worker("second")
    result: dict[str, Any] = job.wait(timeout=90)
    hits = tree_hits(paths_site, name)
    repeats = sum(hits.values()) - PAGES
    assert result["state"] == "done", result
    assert len(hits) == PAGES, f"pages never fetched: {PAGES - len(hits)}"
    assert result["items"] >= PAGES
    assert repeats >= 0
    if step in FETCHES:
        assert hits[trigger] == FETCHES[step], hits
    print(f"{step}: {repeats} pages fetched again, {result['items'] - PAGES} items again")
