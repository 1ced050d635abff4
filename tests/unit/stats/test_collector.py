"""The shared stats hash: types survive, increments are batched, processes add up."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from celery_crawl.core import scripts
from celery_crawl.core.keys import STATS_RATE
from celery_crawl.stats.collector import RedisStatsCollector
from tests.support.ports import persistent_valkey
from tests.support.reply_cutter import ReplyCutter
from tests.support.round_trips import RoundTrips


def collector(make_crawler: Any, **settings: Any) -> RedisStatsCollector:
    stats = make_crawler(**settings).stats
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


def test_a_flush_whose_reply_was_lost_is_added_once(make_crawler: Any, redis_url: str) -> None:
    """Redis ran the call, the reply never came, redis-py sent it again: added once."""
    with ReplyCutter(redis_url) as relay:
        stats = collector(make_crawler, REDIS_URL=relay.url)
        stats.set_value("start", 1)
        stats.flush()  # the server caches the script
        stats.inc_value("response_received_count", 3)  # also counted in the minute's rate
        relay.cut_next_reply()
        stats.flush()
        assert relay.cuts == 1  # the reply was lost: the call reached Redis again
        assert stats.unconfirmed is None
        assert stats.get_value("response_received_count") == 3
        rates = stats.client.keys(stats.keys.stats + STATS_RATE + "*")
        assert [stats.client.hget(key, "response_received_count") for key in rates] == [b"3"]


def test_without_a_number_a_lost_reply_adds_twice(make_crawler: Any, redis_url: str) -> None:
    """What the number guards against, with the same relay and script."""
    with ReplyCutter(redis_url) as relay:
        stats = collector(make_crawler, REDIS_URL=relay.url)
        keys = [stats.keys.stats, stats.keys.stats_types, stats.keys.stats_written("w")]
        update = scripts.script(stats.client, "stats_update")
        update(keys=keys, args=["", 0, "incr", "pages", "0", "i"])  # the server caches it
        relay.cut_next_reply()
        update(keys=keys, args=["", 0, "incr", "pages", "3", "i"])
        assert relay.cuts == 1
        assert stats.client.hget(stats.keys.stats, "pages") == b"6"


def test_a_failed_flush_is_sent_again_as_it_was_before_later_changes(
    make_crawler: Any, client: redis.Redis
) -> None:
    """Refused for a damaged key: kept whole, applied once after the repair, then the rest."""
    stats = collector(make_crawler)
    client.set(stats.keys.stats_types, "not a hash")
    stats.inc_value("pages", 2)
    stats.set_value("finish_reason", "first")
    stats.flush()
    assert stats.unconfirmed is not None  # refused before any write, and kept
    assert client.get(stats.keys.stats_types) is None  # moved aside by the repair
    assert client.hget(stats.keys.stats, "finish_reason") is None  # nothing applied half-way
    stats.inc_value("pages", 5)
    stats.set_value("finish_reason", "second")
    stats.flush()
    assert stats.unconfirmed is None
    assert stats.get_value("pages") == 7
    assert stats.get_value("finish_reason") == "second"  # the later change came after


def test_the_closing_dump_says_when_the_crawl_s_stats_cannot_be_read(
    make_crawler: Any, tmp_path: Path, caplog: Any
) -> None:
    """Redis gone at the close: this process's stats are dumped, the crawl's are named as not
    shown. Before, the crawl's were read inside the logging call, which raised there."""
    with persistent_valkey(tmp_path / "valkey", appendfsync="no") as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        stats = collector(make_crawler, REDIS_URL=url, STATS_DUMP=True)
        stats.inc_value("pages", 2)
        stats.flush()
    stats.inc_value("pages", 1)  # kept in the process: the server is stopped
    with caplog.at_level("INFO", logger="celery_crawl.stats.collector"):
        stats.close_spider(reason="shutdown")  # caplog fails the test on a logging error
    messages = [record.getMessage() for record in caplog.records]
    assert any("this process only:\n{'pages': 3}" in m for m in messages), messages
    assert not any("the whole crawl (every process" in m for m in messages), messages
    unread = [r for r in caplog.records if "the whole crawl's stats" in r.getMessage()]
    assert [r.levelname for r in unread] == ["WARNING"], messages
    assert "are not shown: " in unread[0].getMessage() and "onnect" in unread[0].getMessage()
    assert stats.unconfirmed is not None  # the last change waits for Redis, not lost
