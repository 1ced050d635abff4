"""The scheduler shared by several processes at once."""

from __future__ import annotations

import multiprocessing
from typing import Any

from scrapy import Request

from tests.support.schedulers import drain, open_scheduler
from tests.support.stub_spider import ForumSpider


def _enqueue_overlapping(settings: dict[str, Any], start: int, barrier: Any) -> None:
    from scrapy.utils.test import get_crawler

    crawler = get_crawler(ForumSpider, {**settings, "SCHEDULER_PERSIST": True})
    scheduler = open_scheduler(crawler)
    barrier.wait(timeout=30)
    for i in range(start, start + 1000):
        scheduler.enqueue_request(Request(f"http://127.0.0.1/post/{i}"))
        if i % 50 == 0:
            scheduler.flush()
    scheduler.flush()


def test_race_processes_enqueue_overlapping_requests(settings: dict[str, Any]) -> None:
    """Four processes enqueue overlapping ranges at once: each URL is accepted exactly once."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(4)
    starts = [0, 250, 500, 750]
    workers = [
        context.Process(target=_enqueue_overlapping, args=(settings, s, barrier)) for s in starts
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    from scrapy.utils.test import get_crawler

    # drained without acks: a site cap (SITE_CONCURRENCY) would stop it at its cap
    drained = {**settings, "SCHEDULER_PERSIST": True, "SITE_LIMITS_ENABLED": False}
    consumer = open_scheduler(get_crawler(ForumSpider, drained))
    urls = [r.url for r in drain(consumer)]
    assert len(urls) == 1750
    assert set(urls) == {f"http://127.0.0.1/post/{i}" for i in range(1750)}
    assert len(consumer.df) == 1750
