"""The registry of dedup kinds against every place that must know a kind.

For each kind of ``celery_crawl.dupefilter.filters.KINDS``, on a real server: its
fragment loads into every script with a dupefilter slot and records its kind; the
exporter's size script measures it; the keys it writes are the ones
``celery_crawl.dupefilter.keys.DEDUP_KEYS`` names, of the types repair checks, and its
memory covers them all; its class is a settings path and the docs list it. A new
kind that misses one of these fails here.
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
from celery_crawl.core.repair import dynamic_keys
from celery_crawl.dupefilter.filters import DUPEFILTER_CLASSES, KINDS, Kind, RFPDupeFilter
from celery_crawl.dupefilter.keys import DEDUP_KEYS, dedup_key_types
from celery_crawl.tools import exporter
from tests.unit.test_settings_paths import PATHS

ROOT = Path(__file__).resolve().parents[3]
# the type Redis reports for each type repair checks (core/lua/repair.lua)
REDIS_TYPES = {"counter": b"string", "numbers": b"hash", "string": b"string", "set": b"set"}


@pytest.fixture(params=list(KINDS.values()), ids=lambda kind: kind.name)
def kind(request: pytest.FixtureRequest) -> Kind:
    found: Kind = request.param
    return found


def filled(kind: Kind, client: redis.Redis, prefix: str, count: int = 300) -> RFPDupeFilter:
    """A filter of ``kind`` with ``count`` fingerprints, opened (its kind recorded)."""
    df = kind.filter(client, SpiderKeys.build("forum", prefix=prefix), None)
    df.open()
    rng = random.Random(7)
    assert all(df.add_fingerprints([rng.randbytes(20) for _ in range(count)]))
    return df


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
    df = filled(kind, client, prefix, 1)
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
