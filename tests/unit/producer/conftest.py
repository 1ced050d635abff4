"""The forum spider's keys and queue, on the test's own prefix: what both producers work on."""

from __future__ import annotations

import pytest
import redis

from celery_crawl.core.keys import SpiderKeys
from celery_crawl.queue.queues import PriorityQueue


@pytest.fixture
def keys(prefix: str) -> SpiderKeys:
    return SpiderKeys.build("forum", prefix=prefix)


@pytest.fixture
def queue(client: redis.Redis, keys: SpiderKeys) -> PriorityQueue:
    return PriorityQueue(client, keys)
