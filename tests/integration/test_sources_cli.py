"""``celery-crawl sources``, run as a user would, against a real server: manage, import, export."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import redis
import yaml

from celery_crawl.core.keys import SpiderKeys
from celery_crawl.producer.schedule import Schedule
from tests.support.workers import run_module


def sources(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_module("celery_crawl.tools.cli", ["sources", *args, "-A", "tasks"], env, timeout=60)


def test_sources_are_added_listed_paused_resumed_and_removed(
    env: dict[str, str], state_client: redis.Redis
) -> None:
    seed = '{"forum_id": "00001"}'
    added = sources(env, "add", "forum", "b1", "--seed", seed, "--interval", "300")
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "forum/b1: added"
    keys = SpiderKeys.build("forum", prefix=env["CELERY_CRAWL_KEY_PREFIX"])
    schedule = Schedule(state_client, keys)
    state = schedule.get("b1")
    assert state is not None and state.source.seeds == [{"forum_id": "00001"}]
    assert state.source.interval == 300 and state.due_at is not None
    listed = json.loads(sources(env, "list", "--json").stdout)
    assert [(row["spider"], row["id"], row["interval"]) for row in listed] == [("forum", "b1", 300)]
    assert sources(env, "pause", "forum", "b1").stdout.strip() == "forum/b1: paused"
    assert json.loads(sources(env, "show", "forum", "b1", "--json").stdout)["paused"] is True
    assert sources(env, "resume", "forum", "b1").stdout.strip() == "forum/b1: resumed"
    resumed = schedule.get("b1")
    assert resumed is not None and not resumed.paused and resumed.due_at is not None
    assert sources(env, "remove", "forum", "b1").stdout.strip() == "forum/b1: removed"
    missing = sources(env, "remove", "forum", "b1")
    assert missing.returncode == 2 and "no source 'b1' for spider 'forum'" in missing.stderr
    assert len(schedule) == 0


def test_bad_input_is_refused_with_what_is_wrong_and_changes_nothing(
    env: dict[str, str], state_client: redis.Redis, tmp_path: Path
) -> None:
    unproduced = sources(env, "add", "forum_detail", "p", "--seed", "0000100001")
    assert unproduced.returncode == 0, unproduced.stderr
    assert "forum_detail is not in PRODUCER_SPIDERS" in unproduced.stderr
    assert sources(env, "remove", "forum_detail", "p").returncode == 0
    bad = sources(env, "add", "forum", "a b", "--seed", "00001")
    assert bad.returncode == 2 and "source id 'a b'" in bad.stderr
    short = sources(env, "add", "forum", "a", "--seed", "00001", "--interval", "0.1")
    assert short.returncode == 2 and "interval 0.1 s: from 1 s to a year" in short.stderr
    file = tmp_path / "sources.yaml"
    file.write_text("forum:\n  - id: ok\n    seeds: ['00001']\n  - id: ok\n    seeds: ['2']\n")
    twice = sources(env, "import", str(file))
    assert twice.returncode == 2 and "has a source id twice" in twice.stderr
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[[nospider]]\nid = "x"\nseeds = ["1"]\n')
    refused = sources(env, "import", str(unknown))
    assert refused.returncode == 2 and "nospider" in refused.stderr
    keys = SpiderKeys.build("forum", prefix=env["CELERY_CRAWL_KEY_PREFIX"])
    assert len(Schedule(state_client, keys)) == 0


def test_a_file_imports_syncs_and_exports_back_the_same(
    env: dict[str, str], state_client: redis.Redis, tmp_path: Path
) -> None:
    file = tmp_path / "sources.yaml"
    file.write_text(
        "forum:\n"
        "  - id: busy\n    seeds: [{forum_id: '00001'}]\n    interval: 300\n"
        "  - id: quiet\n    seeds: [{forum_id: '00002'}]\n    interval: 3600\n"
        "    adaptive: true\n    min_interval: 600\n    max_interval: 86400\n    paused: true\n"
    )
    extra = sources(env, "add", "forum", "old", "--seed", "00003")
    assert extra.returncode == 0, extra.stderr
    done = sources(env, "import", str(file), "--sync")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "forum: 2 added, 0 changed, 0 unchanged, 1 removed"
    exported = sources(env, "export")
    assert exported.returncode == 0, exported.stderr
    assert yaml.safe_load(exported.stdout) == yaml.safe_load(file.read_text())
    again = tmp_path / "again.yaml"
    again.write_text(exported.stdout)
    assert sources(env, "import", str(again), "--sync").stdout.strip() == (
        "forum: 0 added, 0 changed, 2 unchanged, 0 removed"
    )
