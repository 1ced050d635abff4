"""The vertical split: list and detail spiders of one group, on their own Celery queues."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from celery import Celery
from scrapy.settings import Settings

from celery_crawl import crawl
from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys, group_members
from celery_crawl.hosting.project import project_of
from celery_crawl.queue.queues import PriorityQueue
from celery_crawl.scheduler.components import Components
from celery_crawl.scheduler.routing import Router
from tests.support.forum import FORUM, assert_complete_forum_crawl, forum_seeds
from tests.support.workers import Worker


def hosted(worker: Worker) -> set[str]:
    lines = re.findall(r"hosting crawlers for (.*)", worker.output())
    return {name.strip() for line in lines for name in line.split(",")}


def items(directory: Path, spider: str) -> list[dict[str, object]]:
    lines = [ln for f in directory.glob(f"{spider}-*.jsonl") for ln in f.read_text().splitlines()]
    return [json.loads(line) for line in lines]


def test_list_and_detail_workers_scale_apart_and_one_job_spans_both(
    app: Celery, start_worker: Callable[..., Worker], db_url: str, tmp_path: Path
) -> None:
    lists = start_worker("lists", pool="solo", queues="forum.list")
    details = start_worker("details", pool="threads", concurrency=2, queues="forum.detail")
    job = crawl("forum", forum_seeds(), app=app)

    result = job.wait(timeout=120)

    assert_complete_forum_crawl(result)  # done only once every post and comment is in
    assert hosted(lists) == {"forum"}
    assert hosted(details) == {"forum_detail"}
    assert lists.stop() == 0 and details.stop() == 0  # flushes the stats, closes the feeds
    project, client = project_of(app), redis.Redis.from_url(db_url)
    expected = FORUM.expected()
    fetched = {
        spider: int(client.hget(project.keys(spider).stats, "response_received_count") or 0)
        for spider in ("forum", "forum_detail")
    }
    assert fetched == {
        "forum": expected.list_pages,
        "forum_detail": expected.posts + expected.not_found + expected.comment_pages,
    }
    assert items(tmp_path, "forum") == []
    detail_items = items(tmp_path, "forum_detail")
    assert sum(item["type"] == "post" for item in detail_items) == expected.posts
    assert sum(item["type"] == "comment" for item in detail_items) == expected.comments


def test_cancel_purges_the_job_from_every_queue_of_its_group(
    app: Celery, start_worker: Callable[..., Worker], db_url: str
) -> None:
    job = crawl("forum", forum_seeds(), app=app)  # no worker: everything stays queued
    project = project_of(app)
    detail = project.queue("forum_detail")
    detail.push_many(project.seed_entries("forum_detail", [{"post_id": "100001"}], job.id, 0))
    other = crawl("forum_detail", [{"post_id": "100002"}], app=app)

    purged = job.cancel()

    assert purged == len(FORUM.forum_ids()) + 1  # its list seeds and its post
    assert len(project.queue("forum")) == 0
    assert len(detail) == 1  # the other job's post
    assert job.status().state == "cancelled"
    assert other.status().state == "running"


def test_group_members_share_a_hash_tag_and_the_job_prefix() -> None:
    settings = Settings({"CELERY_CRAWL_SPIDER_GROUPS": {"forum_detail": "forum"}})
    lists = SpiderKeys.from_settings("forum", settings)
    details = SpiderKeys.from_settings("forum_detail", settings)
    alone = SpiderKeys.from_settings("news", settings)

    assert lists.queue == "celery_crawl:{forum}:queue"
    assert details.queue == "celery_crawl:{forum}/forum_detail:queue"
    assert details.job_prefix == lists.job_prefix == "celery_crawl:{forum}:job:"
    assert alone.queue == "celery_crawl:{news}:queue"
    assert group_members("forum_detail", settings) == ["forum", "forum_detail"]


def test_routing_outside_the_group_is_refused_with_a_clear_error(redis_url: str) -> None:
    settings = Settings({"CELERY_CRAWL_SPIDER_GROUPS": {"forum_detail": "forum"}})
    client = redis.Redis.from_url(redis_url)
    own = PriorityQueue(client, SpiderKeys.from_settings("forum", settings))
    router = Router(own, Components(settings, client))

    assert router.queue("forum_detail").keys.spider == "forum_detail"
    with pytest.raises(ConfigError, match="not in its group 'forum'"):
        router.queue("news")


@pytest.mark.usefixtures("env")
def test_the_producer_cap_counts_every_queue_of_the_group() -> None:
    """Detail requests waiting in ``forum_detail``'s queue hold the ``forum`` producer back."""
    from celery_crawl import create_app
    from celery_crawl.app.client import PRODUCE_TASK
    from tests.support.workers import WORKER_SETTINGS

    cap = 200
    app = create_app("worker_app", WORKER_SETTINGS, settings={"PRODUCER_QUEUE_CAP": cap})
    project = project_of(app)
    detail = project.queue("forum_detail")
    detail.push_many([Entry(f"detail-{i}".encode()) for i in range(cap)])  # nobody consumes
    assert len(project.queue("forum")) == 0
    tick = app.tasks[PRODUCE_TASK].apply(args=("forum",)).get(timeout=60)
    assert tick["queued"] == cap and tick["produced"] == {}
    stats = project.client.hgetall(project.keys("forum").stats)
    assert int(stats[b"producer/held_back"]) == len(project.settings.getlist("PRODUCER_SOURCES"))
