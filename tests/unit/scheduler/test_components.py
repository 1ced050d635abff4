"""One factory builds every queue, dedup filter and producer: each configured the same way."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery
from scrapy.crawler import Crawler

from celery_crawl import crawl, create_app
from celery_crawl.hosting import project as project_module
from celery_crawl.hosting.project import project_of
from celery_crawl.queue.leases import LeaseTimes
from celery_crawl.queue.queues import Base, FifoQueue
from celery_crawl.scheduler.components import Components
from celery_crawl.scheduler.scheduler import Scheduler

GROUP_SETTINGS = {
    "CELERY_CRAWL_SPIDER_GROUPS": {"detail": "forum"},
    "SCHEDULER_QUEUE_CLASS": "celery_crawl.queue.FifoQueue",
    "SCHEDULER_LEASE_SECONDS": 7,
    "SCHEDULER_DEADLETTER_MAX": 5,
    "DUPEFILTER_SCOPE": "job",
    "DUPEFILTER_CLASS": "celery_crawl.dupefilter.ExpiringDupeFilter",
    "SITE_LIMITS_ENABLED": True,
}


def configuration(queue: Base) -> tuple[Any, ...]:
    return (
        type(queue),
        queue.leases,
        queue.deadletter_max,
        queue.dedup_scope,
        queue.dedup,
        queue.sites.enabled,
        queue.ack_timeout,
    )


def test_every_queue_of_a_group_is_configured_as_the_schedulers_own(make_crawler: Any) -> None:
    crawler = make_crawler(**GROUP_SETTINGS)
    scheduler = Scheduler.from_crawler(crawler)
    own = scheduler.queue
    assert type(own) is FifoQueue and own.leases == LeaseTimes(7) and own.sites.enabled
    routed = scheduler.router.queue("detail")  # type: ignore[union-attr]
    built = Components.from_crawler(crawler).queue("detail")
    assert configuration(routed) == configuration(own) == configuration(built)
    assert routed.keys.spider == built.keys.spider == "detail"
    assert [keys.spider for keys in scheduler.group] == ["forum", "detail"]


def test_the_producer_is_capped_over_the_group_the_scheduler_repairs(make_crawler: Any) -> None:
    crawler = make_crawler(**GROUP_SETTINGS, PRODUCER_JOB_CAP=4, PRODUCER_QUEUE_CAP=9)
    producer = Components.from_crawler(crawler).producer("forum")
    scheduler = Scheduler.from_crawler(crawler)
    assert (producer.job_cap, producer.queue_cap) == (4, 9)
    assert producer.group == scheduler.group == scheduler.repairer.group


def test_a_dupefilter_is_the_kind_and_has_the_keys_of_the_schedulers(make_crawler: Any) -> None:
    crawler = make_crawler(**GROUP_SETTINGS)
    scheduler = Scheduler.from_crawler(crawler)
    built = Components.from_crawler(crawler).dupefilter("forum")
    assert type(built) is type(scheduler.df)
    assert built.keys == scheduler.df.keys and built.script == scheduler.df.script


@pytest.fixture
def app(db_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Celery:
    monkeypatch.setenv("REDIS_URL", db_url)
    return create_app("components", "tasks.settings", settings={"CELERY_CRAWL_KEY_PREFIX": prefix})


def test_one_crawl_builds_one_crawler(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    class CountedCrawler(Crawler):
        def __init__(self, spidercls: Any, *args: Any, **kwargs: Any) -> None:
            built.append(spidercls.name)
            super().__init__(spidercls, *args, **kwargs)

    monkeypatch.setattr(project_module, "Crawler", CountedCrawler)
    job = crawl("forum", [{"forum_id": "00001"}], app=app)
    assert built == ["forum"]
    assert job.status().state == "running"
    queue = project_of(app).queue("forum")
    assert len(queue) == 1
    assert isinstance(queue.client, redis.Redis)
