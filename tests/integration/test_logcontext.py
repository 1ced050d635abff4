"""A hosted crawler's log lines name their spider, and their job, in a real worker's log file."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from celery import Celery

from celery_crawl import crawl
from tests.support.static_site import StaticSite, serve
from tests.support.workers import Worker

SPIDER = "hosted_members_local"
PAGES = 15


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_lines_name_their_spider_and_job(
    app: Celery, start_worker: Callable[..., Worker], pool: str
) -> None:
    """Two jobs of one spider, queued before the worker starts, so that their callbacks
    run interleaved in its one process: each callback's line names its own job."""
    with serve(StaticSite(pages=PAGES)) as site:
        seeds = {tag: {"site": site.url, "pages": PAGES, "login": False} for tag in "ab"}
        jobs = {tag: crawl(SPIDER, [{**seed, "tag": tag}], app=app) for tag, seed in seeds.items()}
        worker = start_worker("w1", pool=pool, concurrency=1)
        assert [job.wait(timeout=120)["state"] for job in jobs.values()] == ["done", "done"]
    assert worker.stop() == 0
    lines = worker.output().splitlines()
    opened = [line for line in lines if line.endswith("Spider opened")]
    hosted = app.celery_crawl_project.hosted_spiders()
    assert len(opened) == len(hosted), opened
    assert all(re.search(r"\] \[\w+\] Spider opened$", line) for line in opened), opened
    assert any(line.endswith(f"[{SPIDER}] Spider opened") for line in opened)
    # the worker's shutdown works for no job: its lines name their spider only
    shutdown = re.compile(r"(Closing spider|Dumping Scrapy stats|Spider closed)")
    closing = [line for line in lines if shutdown.search(line)]
    assert len(closing) == 4 * len(hosted), closing  # closing, two stats dumps, closed
    spider_only = re.compile(r"\] \[\w+\] " + shutdown.pattern)
    assert [line for line in closing if not spider_only.search(line)] == []
    for tag, job in jobs.items():
        tagged = [line for line in lines if f"of tag {tag}: 403" in line]
        assert len(tagged) == PAGES, tagged
        assert all(f"[{SPIDER} job={job.id}] member page " in line for line in tagged), tagged
