"""Sources files, and the producer's sync of ``PRODUCER_SOURCES_FILE``, on a real server."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_crawl.core.errors import BadInput
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.producer import sources_file
from celery_crawl.producer.schedule import Schedule, Source
from tests.support.full_redis import fill_to_refusal
from tests.support.ports import started_valkey

FILE = """\
forum:
  - id: busy
    seeds: [{forum_id: "00001"}]
    interval: 300
  - id: quiet
    seeds: [{forum_id: "00002"}]
    interval: 86400
    paused: true
other:
  - id: elsewhere
    seeds: ["x"]
"""


@pytest.fixture
def schedule(client: redis.Redis, keys: SpiderKeys) -> Schedule:
    return Schedule(client, keys)


def test_yaml_toml_and_json_give_the_same_sources() -> None:
    toml = """\
[[forum]]
id = "busy"
seeds = [{forum_id = "00001"}]
interval = 300
"""
    json_text = '{"forum": [{"id": "busy", "seeds": [{"forum_id": "00001"}], "interval": 300}]}'
    expected = {"forum": [(Source("busy", [{"forum_id": "00001"}], 300), None)]}
    assert sources_file.parse(toml, ".toml") == expected
    assert sources_file.parse(json_text, ".json") == expected
    assert sources_file.parse(FILE, ".yaml")["forum"][1][1] is True  # paused, as given


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("forum: [", "not YAML"),
        ("- a list", "a mapping of spider name"),
        ("forum: {id: x}", "a list of sources"),
        ("forum: [{id: a, seeds: [x]}, {id: a, seeds: [y]}]", "a source id twice"),
        ("forum: [{id: a, seeds: [x], colour: red}]", "unknown fields"),
        ("forum: [{id: a, seeds: [x], paused: maybe}]", "paused is true or false"),
        ("forum: [{id: a, seeds: [x], interval: 0}]", "from 1 s to a year"),
    ],
)
def test_a_file_that_breaks_a_rule_says_what(text: str, says: str) -> None:
    with pytest.raises(BadInput, match=says):
        sources_file.parse(text, ".yaml")


def test_the_sources_file_is_synced_when_it_changes_and_only_then(
    schedule: Schedule, client: redis.Redis, keys: SpiderKeys, tmp_path: Path
) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(FILE)
    counts = sources_file.sync_file(schedule, str(path))
    assert counts == {"added": 2, "changed": 0, "unchanged": 0, "removed": 0}
    assert [source.id for source in schedule.sources()] == ["busy", "quiet"]  # forum's only
    busy = schedule.get("busy")
    assert busy is not None and busy.due_at is not None and not busy.paused
    assert busy.due_at <= client.time()[0] + 1  # due at once
    quiet = schedule.get("quiet")
    assert quiet is not None and quiet.paused
    assert sources_file.sync_file(schedule, str(path)) is None  # unchanged: nothing done
    schedule.put(Source("by-hand", ["y"], 60))  # a change made at run time stays...
    assert sources_file.sync_file(schedule, str(path)) is None
    assert schedule.get("by-hand") is not None
    path.write_text(FILE.replace("interval: 300", "interval: 600").replace("paused: true", ""))
    counts = sources_file.sync_file(schedule, str(path))  # ...until the file changes
    # quiet's definition is the same: only its paused state changes
    assert counts == {"added": 0, "changed": 1, "unchanged": 1, "removed": 1}
    state = schedule.get("quiet")
    assert state is not None and not state.paused  # the file is the truth: not paused
    busy = schedule.get("busy")
    assert busy is not None and busy.source.interval == 600
    assert schedule.get("by-hand") is None


def test_a_file_that_cannot_be_read_changes_nothing_and_is_logged_once(
    schedule: Schedule, client: redis.Redis, keys: SpiderKeys, tmp_path: Path, caplog: Any
) -> None:
    path = tmp_path / "sources.yaml"
    path.write_text(FILE)
    sources_file.sync_file(schedule, str(path))
    path.write_text(FILE + "  - id: [broken\n")
    with caplog.at_level(logging.ERROR):
        assert sources_file.sync_file(schedule, str(path)) is None
        assert sources_file.sync_file(schedule, str(path)) is None
    assert caplog.text.count("the schedule is unchanged") == 1
    assert client.hget(keys.stats, "producer/sources_file_errors") == b"1"
    assert [source.id for source in schedule.sources()] == ["busy", "quiet"]
    path.unlink()
    with caplog.at_level(logging.ERROR):
        assert sources_file.sync_file(schedule, str(path)) is None
    assert "not read" in caplog.text
    path.write_text(FILE.replace("- id: quiet", "- id: calm"))  # fixed: synced again
    counts = sources_file.sync_file(schedule, str(path))
    assert counts is not None and counts["added"] == 1 and counts["removed"] == 1


def test_a_spider_the_file_does_not_name_keeps_its_sources_and_an_empty_list_clears_them(
    client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    schedule = Schedule(client, SpiderKeys.build("absent", prefix=prefix))
    schedule.put(Source("kept", ["x"], 60))
    path = tmp_path / "sources.yaml"
    path.write_text(FILE)
    assert sources_file.sync_file(schedule, str(path)) is None
    assert [source.id for source in schedule.sources()] == ["kept"]
    path.write_text(FILE + "absent: []\n")
    assert sources_file.sync_file(schedule, str(path)) == {
        "added": 0,
        "changed": 0,
        "unchanged": 0,
        "removed": 1,
    }
    assert schedule.sources() == []


def test_a_sync_redis_refuses_is_logged_counted_and_tried_again_next_tick(
    tmp_path: Path, caplog: Any
) -> None:
    server = started_valkey(tmp_path / "valkey")  # its own: made full
    try:
        client = redis.Redis(port=server.port)
        keys = SpiderKeys.build("forum", prefix="full")
        schedule = Schedule(client, keys)
        path = tmp_path / "sources.yaml"
        path.write_text(FILE)
        fill_to_refusal(client, room=1_000_000)
        with caplog.at_level(logging.ERROR):
            assert sources_file.sync_file(schedule, str(path)) is None  # no exception: the
            assert sources_file.sync_file(schedule, str(path)) is None  # tick goes on
        assert caplog.text.count("tried again next tick") == 2
        client.delete("filler")  # room again: the same version is synced at the next tick
        assert sources_file.sync_file(schedule, str(path)) == {
            "added": 2,
            "changed": 0,
            "unchanged": 0,
            "removed": 0,
        }
    finally:
        server.stop()
