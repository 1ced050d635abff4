"""Schedulers driven by hand, without an engine: opened on the stub spider, and drained."""

from __future__ import annotations

from scrapy import Request
from scrapy.crawler import Crawler

from celery_crawl.scheduler.scheduler import Scheduler
from tests.support.stub_spider import ForumSpider


def open_scheduler(crawler: Crawler) -> Scheduler:
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(ForumSpider.from_crawler(crawler))
    return scheduler


def drain(scheduler: Scheduler, limit: int = 10_000) -> list[Request]:
    requests = []
    for _ in range(limit):
        request = scheduler.next_request()
        if request is None:
            break
        requests.append(request)
    return requests
