"""A worker cut off mid-job comes back after the job ended: the job's counters stay put.

The ``fault_tree`` spider holds the first process that parses the trigger page
(``pause_after_parse``, tests/support/fault_spider.py) with the page's
children in its write-behind buffer and its stats (its item) held for its
ack; the test stops that worker's whole process group (SIGSTOP: its lease
renewals stop too, as for a worker cut off from Redis), so its leases lapse
and a second worker crawls the job to its end. Then the first worker goes on
and flushes what it had, the acks with their pages' stats: its stats of the
ended job are kept apart (the job's ``late`` fields), and the counters
``wait()`` returned do not move.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery

from celery_crawl import crawl
from tests.support.paths_spider import TREE_LEVELS, PathsSite
from tests.support.waiting import wait_for
from tests.support.workers import Worker

PAGES = 2**TREE_LEVELS - 1
LATE_FLUSH_SECONDS = 60  # bound on the wait for the resumed worker's flush


def test_a_late_worker_leaves_the_ended_jobs_counters_alone(
    env: dict[str, str],
    app: Celery,
    start_worker: Callable[..., Worker],
    paths_site: PathsSite,
    tmp_path: Path,
) -> None:
    trigger = "/tree/late/rab"  # two levels down, with children of its own
    marker = tmp_path / "paused"
    env.update(FAULT_STEP="pause_after_parse", FAULT_TRIGGER=trigger, FAULT_MARKER=str(marker))
    first = start_worker("first")
    job = crawl("fault_tree", [{"tree": "late"}], app=app)
    wait_for(marker.exists, 30, "the trigger page parsed")
    first.signal(signal.SIGSTOP)
    try:
        start_worker("second")
        result: dict[str, Any] = job.wait(timeout=90)
    finally:
        marker.unlink(missing_ok=True)  # the held process goes on once it runs again
        first.signal(signal.SIGCONT)
    assert result["state"] == "done", result
    assert result["pages"] >= PAGES
    assert paths_site.hits[trigger] == 2  # once by each worker

    def changed() -> dict[str, Any]:
        now = job.status().as_dict()
        return {k: (result[k], v) for k, v in now.items() if k != "late" and v != result[k]}

    # the resumed worker's flushes show as late stats (or, wrongly, on the counters); the
    # page's own stats (its item) come with its ack, which can follow its children's flush
    wait_for(
        lambda: bool(changed()) or "items" in job.status().as_dict()["late"],
        LATE_FLUSH_SECONDS,
        "the resumed worker's ack of the trigger page",
    )
    assert changed() == {}
    late = job.status().as_dict()["late"]
    assert late.get("items", 0) >= 1 and late.get("pages", 0) >= 1, late
    wait_for(lambda: f"job {job.id} had ended" in first.output(), 10, "the late stats logged")
