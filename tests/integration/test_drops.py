"""A request that cannot be queued, in a job hosted by a real Celery worker: never silent."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis
from celery import Celery

from celery_crawl import JobIncomplete, crawl
from celery_crawl.hosting.project import project_of
from celery_crawl.tools.status import snapshot
from tests.support.metrics import scrape, total
from tests.support.paths_spider import PathsSite
from tests.support.workers import Worker


def test_a_job_whose_callback_yields_an_unqueueable_request_ends_incomplete(
    app: Celery,
    start_worker: Callable[..., Worker],
    paths_site: PathsSite,
    state_client: redis.Redis,
) -> None:
    worker = start_worker(pool="solo")
    job = crawl("paths", [{"unqueueable": "1"}], app=app)
    result = job.wait(timeout=120)
    assert result["state"] == "incomplete", result
    assert (result["pages"], result["items"], result["dropped"]) == (2, 2, 1)  # page and child
    assert result["errors"] == {"dropped/unserializable": 1}
    with pytest.raises(JobIncomplete, match="1 requests could not be queued"):
        job.result.get(timeout=30)  # the Celery task is not a clean success
    assert paths_site.hits["/ok/unqueueable-1/child"] == 1
    assert "/ok/unqueueable-1/never" not in paths_site.hits
    assert worker.stop() == 0  # flushes the last stats
    output = worker.output()
    assert output.count("dropped a request that cannot be queued (unserializable)") == 1

    client = state_client
    keys = project_of(app).keys("paths")
    (record,) = [json.loads(r) for r in client.lrange(keys.deadletter, 0, -1)]
    assert record["reason"] == "unserializable" and record["error"]
    assert record["request"]["url"] == f"{paths_site.url}/ok/unqueueable-1/never"
    assert (record["request"]["job"], record["request"]["callback"]) == (job.id, "parse_leaf")

    metrics = scrape(client, [keys])
    assert total(metrics, "celery_crawl_dropped_total", kind="unserializable") == 1
    assert total(metrics, "celery_crawl_jobs_finished_total", state="incomplete") == 1
    assert total(metrics, "celery_crawl_jobs_finished_total", state="done") == 0
    (spider,) = snapshot(client, [keys], app)["spiders"]
    assert spider["dropped"] == 1
