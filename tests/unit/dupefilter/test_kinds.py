"""The registry of dedup kinds against every place that must know a kind.

For each kind of ``celery_crawl.dupefilter.filters.KINDS``, on a real server: its
fragment loads into every script with a dupefilter slot and records its kind; the
exporter's size script measures it; the keys it writes, those a job's source ties to it
included, are the ones ``celery_crawl.dupefilter.keys.DEDUP_KEYS`` names, of the types
repair checks; each of them, damaged, is moved aside and the call goes through; its
memory covers them all; its class is a settings path and the docs list it. A new kind
that misses one of these fails here.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
import redis

import celery_crawl.dupefilter
from celery_crawl.core import scripts
from celery_crawl.core.defaults import SETTINGS
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.core.repair import REFUSAL_TYPES, dynamic_keys
from celery_crawl.dupefilter.filters import DUPEFILTER_CLASSES, KINDS, Kind, RFPDupeFilter
from celery_crawl.dupefilter.keys import DEDUP_KEYS, DEDUP_REMOVED, dedup_key_types
from celery_crawl.queue.queues import PriorityQueue
from celery_crawl.tools import exporter
from tests.support.source_crawls import crawl_source
from tests.unit.test_settings_paths import PATHS

ROOT = Path(__file__).resolve().parents[3]
# the type Redis reports for each type repair checks (core/lua/repair.lua)
REDIS_TYPES = {
    "counter": b"string",
    "numbers": b"hash",
    "string": b"string",
    "set": b"set",
    "hash": b"hash",
    "zset": b"zset",
    "list": b"list",
}
SOURCED = 5  # of a filter's fingerprints, those a job of a source adds (its children)


@pytest.fixture(params=list(KINDS.values()), ids=lambda kind: kind.name)
def kind(request: pytest.FixtureRequest) -> Kind:
    found: Kind = request.param
    return found


def fingerprints(count: int) -> list[bytes]:
    rng = random.Random(7)
    return [rng.randbytes(20) for _ in range(count)]


def filled(kind: Kind, client: redis.Redis, prefix: str, count: int = 300) -> RFPDupeFilter:
    """A filter of ``kind`` with ``count`` fingerprints, opened (its kind recorded): the
    last ``SOURCED`` of them a job's children, so that keys tied to a source are written."""
    df = kind.filter(client, SpiderKeys.build("forum", prefix=prefix), None)
    df.open()
    fps = fingerprints(count)
    assert all(df.add_fingerprints(fps[:-SOURCED]))
    assert all(crawl(df, "job-1", fps[-SOURCED:]))
    return df


def crawl(df: RFPDupeFilter, job: str, children: list[bytes]) -> list[bool]:
    """A job of source ``board`` (spider scope: its children meet the spider's filter)
    whose seed has ``children``. Which children were new."""
    queue = PriorityQueue(df.client, df.keys, dedup=df.script, dedup_scope="spider")
    return crawl_source(queue, job, "board", children)


def written(client: redis.Redis, df: RFPDupeFilter) -> list[str]:
    return sorted(k.decode() for k in client.scan_iter(match=df.keys.dupefilter + ":*"))


def test_the_registry_names_each_kind_once_with_its_keys() -> None:
    assert set(DEDUP_KEYS) == {"", *KINDS}
    assert len({kind.filter for kind in KINDS.values()}) == len(KINDS)
    assert len({kind.fragment for kind in KINDS.values()}) == len(KINDS)
    assert all(kind.size in ("count", "own") for kind in KINDS.values())


def test_its_fragment_loads_in_every_script_with_a_dupefilter_slot(
    kind: Kind, client: redis.Redis
) -> None:
    for name in scripts.entry_scripts():
        if "dupefilter" in scripts.slots(name):
            sha = client.script_load(scripts.source(name, dupefilter=kind.fragment))
            assert client.script_exists(sha) == [True]


def test_it_records_its_name_as_its_kind(kind: Kind, client: redis.Redis, prefix: str) -> None:
    df = filled(kind, client, prefix, SOURCED)
    assert df.kind == kind.name
    assert client.get(df.keys.dupefilter + ":kind") == kind.name.encode()


def test_the_exporters_size_script_measures_it(
    kind: Kind, client: redis.Redis, prefix: str
) -> None:
    df = filled(kind, client, prefix)
    assert exporter.read(client, [df.keys])[0].fingerprints == len(df) == 300
    fragment = f"local DEDUP_KIND = '{kind.name}'"  # its fragment, put in
    in_size = fragment in scripts.source("spider_size")
    assert in_size == (kind.size == "own")  # a kind with its own count is read by its fragment
    if kind.size == "count":
        assert client.get(df.keys.dupefilter_count) == b"300"


def test_repair_knows_the_type_of_every_key_it_writes(
    kind: Kind, client: redis.Redis, prefix: str
) -> None:
    df = filled(kind, client, prefix)
    keys = written(client, df)
    assert dedup_key_types(df.keys.dupefilter, keys) == dynamic_keys(client, df.keys)
    declared = {
        re.escape(f"{df.keys.dupefilter}:")
        + name.replace("<n>", r"\d+").replace("<source>", r"[A-Za-z0-9_.-]+"): wanted
        for name, wanted in kind.keys.items()
    }
    for key in keys:
        wanted = [w for pattern, w in declared.items() if re.fullmatch(pattern, key)]
        assert wanted, f"{key} is not among the keys of {kind.name} (dupefilter/keys.py DEDUP_KEYS)"
        if wanted[0] is not None:
            assert client.type(key) == REDIS_TYPES[wanted[0]], key
            assert dynamic_keys(client, df.keys)[key] == wanted[0]


def test_repair_knows_every_type_a_kind_declares() -> None:
    declared = {wanted for kind in KINDS.values() for wanted in kind.keys.values()}
    assert declared - {None} <= set(REFUSAL_TYPES.values()) == set(REDIS_TYPES)


def damage(client: redis.Redis, key: str, wanted: str) -> None:
    """``key`` rewritten as a value of another type than ``wanted``."""
    client.delete(key)
    if REDIS_TYPES[wanted] == b"string":
        client.rpush(key, "damaged")
    else:
        client.set(key, "damaged")


def test_each_key_it_writes_damaged_is_moved_aside_and_the_calls_go_through(
    kind: Kind, client: redis.Redis, prefix: str
) -> None:
    """For one key of each name it declares (but the counts of what a cancelled job
    removed, which ``filled`` does not write): the filter's own calls, then a job's, go
    through, and whichever meets the key first moves it aside."""
    probe = filled(kind, client, f"{prefix}probe")
    base = probe.keys.dupefilter + ":"
    patterns = {
        name.replace("<n>", r"\d+").replace("<source>", r"[A-Za-z0-9_.-]+"): wanted
        for name, wanted in kind.keys.items()
        if wanted is not None and not name.endswith(DEDUP_REMOVED)
    }
    found = {
        name: key.removeprefix(base)
        for name in patterns
        for key in written(client, probe)
        if re.fullmatch(name, key.removeprefix(base))
    }
    assert set(found) == set(patterns), f"only {sorted(found)} were written: see filled()"
    fps = fingerprints(300)
    for number, (name, suffix) in enumerate(found.items()):
        df = filled(kind, client, f"{prefix}{number}")
        key = f"{df.keys.dupefilter}:{suffix}"
        damage(client, key, patterns[name])
        again = kind.filter(client, df.keys, None)  # a repairer of its own: not just used
        again.add_fingerprints(fps[:-SOURCED])
        crawl(again, "job-2", fps[-SOURCED:])
        assert client.exists(key + "~damaged"), key
        assert client.type(key) in (b"none", REDIS_TYPES[patterns[name]]), key


def test_its_memory_covers_every_key_it_writes(
    kind: Kind, client: redis.Redis, prefix: str
) -> None:
    df = filled(kind, client, prefix)
    keys = [key for key in written(client, df) if not key.endswith(":kind")]
    usage: Any = sum(client.memory_usage(key, samples=0) or 0 for key in keys)
    assert df.memory_usage() == usage > 0


def test_its_class_is_a_settings_path_and_the_docs_list_it(kind: Kind) -> None:
    name = kind.filter.__name__
    assert DUPEFILTER_CLASSES[kind.path] is kind.filter
    assert getattr(celery_crawl.dupefilter, name) is kind.filter
    assert name in celery_crawl.dupefilter.__all__
    assert PATHS[kind.path] == f"celery_crawl.dupefilter.filters.{name}"
    assert f"`{name}`" in SETTINGS["DUPEFILTER_CLASS"].meaning
    assert f"`{name}`" in (ROOT / "docs" / "settings.md").read_text()
    assert f"`celery_crawl.dupefilter.{name}`" in (ROOT / "docs" / "scrapy-projects.md").read_text()
    layout = (ROOT / "docs" / "redis-layout.md").read_text()
    assert f"dupefilter/lua/include/{kind.fragment}.lua" in layout
