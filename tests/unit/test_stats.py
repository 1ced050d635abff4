"""The shared stats hash: types survive, increments are batched, processes add up."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import redis

from celery_crawl.stats import RedisStatsCollector
from tests.support.round_trips import RoundTrips


def collector(make_crawler: Any) -> RedisStatsCollector:
    stats = make_crawler().stats
    assert isinstance(stats, RedisStatsCollector)
    return stats


def test_types_survive_a_round_trip(make_crawler: Any) -> None:
    stats = collector(make_crawler)
    started = datetime(2026, 11, 21, 8, 30, 5, 123456, tzinfo=UTC)
    values = {
        "int": 7,
        "float": 2.5,
        "bool": True,
        "start_time": started,
        "finish_reason": "finished",
        "list": [1, "a"],
        "neg": -3,
    }
    for key, value in values.items():
        stats.set_value(key, value)
    stats.flush()
    fresh = collector(make_crawler)  # another process's view: nothing cached locally
    for key, value in values.items():
        got = fresh.get_value(key)
        assert got == value and type(got) is type(value), key
    assert fresh.get_stats() == values
    assert fresh.get_value("missing", "default") == "default"


def test_increments_are_batched_into_one_round_trip(make_crawler: Any, client: redis.Redis) -> None:
    stats = collector(make_crawler)
    with RoundTrips(stats.client) as trips:
        for _ in range(500):
            stats.inc_value("downloader/request_count")
            stats.inc_value("downloader/request_bytes", 120)
            stats.inc_value("elapsed", 0.5)
        assert trips.count == 0
        stats.flush()
        assert trips.commands == ["EVALSHA"]
    assert stats.get_value("downloader/request_count") == 500
    assert stats.get_value("downloader/request_bytes") == 60_000
    assert stats.get_value("elapsed") == 250.0


def test_two_collectors_add_up_and_max_min_are_atomic(make_crawler: Any) -> None:
    first, second = collector(make_crawler), collector(make_crawler)
    first.inc_value("items", 3)
    second.inc_value("items", 4)
    first.max_value("memusage/max", 100)
    second.max_value("memusage/max", 250)
    first.max_value("memusage/max", 200)
    first.min_value("fastest", 0.4)
    second.min_value("fastest", 0.2)
    first.flush()
    second.flush()
    assert first.get_value("items") == 7
    assert second.get_value("memusage/max") == 250
    assert first.get_value("fastest") == 0.2


def test_inc_with_start_set_after_increment_and_clear(make_crawler: Any) -> None:
    stats = collector(make_crawler)
    stats.inc_value("from_ten", 1, start=10)
    stats.inc_value("x", 2)
    stats.set_value("x", 100)
    assert stats.get_value("from_ten") == 11
    assert stats.get_value("x") == 100
    stats.clear_stats()
    assert stats.get_stats() == {}


def test_a_damaged_number_reads_as_missing(make_crawler: Any, client: redis.Redis) -> None:
    """Scrapy's LogStats subtracts item_scraped_count: text there stopped its loop."""
    stats = collector(make_crawler)
    stats.inc_value("item_scraped_count", 3)
    stats.flush()
    client.hset(stats.keys.stats, "item_scraped_count", "garbage")
    assert stats.get_value("item_scraped_count", 0) == 0
    stats.inc_value("item_scraped_count", 2)  # the count starts afresh
    assert stats.get_value("item_scraped_count", 0) == 2
