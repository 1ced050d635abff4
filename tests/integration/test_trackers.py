"""A running job holds no pool slot: a one-slot worker runs other tasks while its job runs."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Callable

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from celery_crawl import crawl
from celery_crawl.app.client import PRODUCE_TASK
from celery_crawl.hosting.project import project_of
from tests.support.waiting import wait_for
from tests.support.workers import Worker

LONG_CHAIN = 400  # pages of the long job: 0.5 s each, so it runs until the test cancels it


@pytest.mark.parametrize("pool", ["prefork", "solo", "threads"])
def test_producer_runs_their_jobs_and_a_short_task_run_while_a_long_job_runs(
    app: Celery,
    start_worker: Callable[..., Worker],
    state_client: redis.Redis,
    pool: str,
) -> None:
    """One pool slot: a job task used to hold it until its job ended, and nothing else ran."""
    worker = start_worker(f"one-slot-{pool}", pool=pool, concurrency=1)
    long = crawl("paths", [{"chain": f"long-{pool}", "length": LONG_CHAIN}], app=app)
    tracked = AsyncResult(long.id, app=app)
    wait_for(lambda: tracked.state == "PROGRESS", 60, "the long job's task reports progress")
    sources = [json.dumps({"chain": f"produced-{pool}-{i}", "length": 2}) for i in range(2)]
    state_client.sadd(project_of(app).keys("paths").sources, *sources)
    producer_runs = [app.send_task(PRODUCE_TASK, args=("paths",)) for _ in range(3)]
    short = app.send_task("celery.accumulate", args=(pool,))

    assert short.get(timeout=60) == [pool]  # celery.accumulate returns its arguments
    ticks = [run.get(timeout=60) for run in producer_runs]
    produced = {source: job_id for tick in ticks for source, job_id in tick["produced"].items()}
    assert sorted(produced) == sorted(sources)
    results = [AsyncResult(job_id, app=app).get(timeout=60) for job_id in produced.values()]
    assert [(r["state"], r["pages"]) for r in results] == [("done", 2), ("done", 2)]
    # all of it ran while the long job ran: it has not ended, and its task still reports
    status = long.status()
    assert (status.state, status.finished) == ("running", False)
    assert tracked.state == "PROGRESS" and status.pages < LONG_CHAIN

    app.control.revoke(long.id)  # cooperative: the job is cancelled, its task returns
    ended = tracked.get(timeout=60)
    assert ended["state"] == "cancelled" and ended["pages"] < LONG_CHAIN
    assert worker.proc.poll() is None


def test_a_job_task_revoked_before_any_worker_took_it_returns_its_cancelled_job(
    app: Celery, start_worker: Callable[..., Worker]
) -> None:
    """The revoke cancels the job in Redis at once; its task, taken later, is not dropped
    on receipt (Celery's own revoke: ``TaskRevokedError``) but returns the job, cancelled."""
    worker = start_worker("revoked-queued", pool="solo", concurrency=1, queues="elsewhere")
    job = crawl("paths", [{"chain": "revoked-queued", "length": 3}], app=app)
    tracked = AsyncResult(job.id, app=app)
    replies = app.control.revoke(job.id, reply=True, timeout=10)
    assert f"jobs cancelled: [{job.id!r}]; tasks revoked: []" in str(replies), replies
    assert job.status().state == "cancelled"
    assert tracked.state == "PENDING"  # still in the broker: no worker consumes its queue
    destination = [f"{worker.name}@{socket.gethostname()}"]
    added = app.control.add_consumer(
        app.conf.task_default_queue, destination=destination, reply=True, timeout=10
    )
    assert added, "the worker did not answer add_consumer"
    ended = tracked.get(timeout=60)
    assert (ended["state"], ended["pages"]) == ("cancelled", 0)


@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_a_warm_shutdown_hands_a_running_job_task_to_the_next_worker(
    app: Celery, start_worker: Callable[..., Worker], pool: str
) -> None:
    """The tracker threads are waited for, and their job tasks go back to the broker."""
    stopping = start_worker(f"stopping-{pool}", pool=pool, concurrency=1)
    long = crawl("paths", [{"chain": f"handed-{pool}", "length": LONG_CHAIN}], app=app)
    tracked = AsyncResult(long.id, app=app)
    wait_for(lambda: tracked.state == "PROGRESS", 60, "the job's task reports progress")
    stopping.proc.send_signal(signal.SIGTERM)
    assert stopping.proc.wait(timeout=60) == 0
    assert long.status().state == "running"  # handed back, not ended
    start_worker(f"next-{pool}", pool=pool, concurrency=1)
    # the next worker has taken the task: the result below is the one it returns
    wait_for(
        lambda: tracked.state == "PROGRESS" and f"next-{pool}@" in str(tracked.worker),
        60,
        "the next worker's task reports progress",
    )
    app.control.revoke(long.id)
    ended = tracked.get(timeout=60)  # returned by the next worker's task
    assert ended["state"] == "cancelled" and ended["pages"] < LONG_CHAIN
    assert f"next-{pool}@" in str(tracked.worker)
