"""Fixtures: a real Redis-protocol server, a key prefix per test, a crawler."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from helpers import ForumSpider
from scrapy import Spider
from scrapy.crawler import Crawler
from scrapy.utils.test import get_crawler

from celery_crawl import embedded
from celery_crawl.connection import get_redis

pytest_plugins = ["worker_fixtures", "ha_servers"]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """``REDIS_URL`` when set; otherwise an embedded Valkey on a free port."""
    with embedded.redis_url() as url:
        yield url


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return get_redis(redis_url)


@pytest.fixture
def prefix(client: redis.Redis) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    value = f"test-{uuid.uuid4().hex[:10]}"
    yield value
    keys = list(client.scan_iter(match=f"{value}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def settings(redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "REDIS_URL": redis_url,
        "CELERY_CRAWL_KEY_PREFIX": prefix,
        "SCHEDULER": "celery_crawl.scheduler.Scheduler",
        "STATS_CLASS": "celery_crawl.stats.RedisStatsCollector",
        "LOG_LEVEL": "INFO",
    }


@pytest.fixture
def make_crawler(settings: dict[str, Any]) -> Any:
    def make(spidercls: type[Spider] = ForumSpider, **overrides: Any) -> Crawler:
        return get_crawler(spidercls, {**settings, **overrides})

    return make


@pytest.fixture
def spider(make_crawler: Any) -> Spider:
    crawler = make_crawler()
    return ForumSpider.from_crawler(crawler)
