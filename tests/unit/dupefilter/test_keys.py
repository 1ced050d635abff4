"""The names of a dedup filter's keys (``celery_crawl.dupefilter.keys``), as stored."""

from __future__ import annotations

import re

import redis

from celery_crawl.core.keys import SpiderKeys
from celery_crawl.dupefilter.keys import DEDUP_KEYS, lua_dedup_keys
from tests.support import ROOT

STORED = ("exact", "bloom", "expiring", "hits")  # the kinds that filters in Redis may hold


def test_the_generated_dedup_keys_keep_the_names_stored_filters_use(
    client: redis.Redis,
) -> None:
    """Literal names: filters written before keep being found (``DEDUP_KEYS`` and the Lua
    are made from the same parts, so only a literal pins the stored layout)."""
    d = SpiderKeys.build("spider", prefix="p").dupefilter
    script = (
        f"local d = KEYS[1]\n{lua_dedup_keys()}\n"
        "return {dedup_kind_key(d), sets_bucket_key(d, 2, 17), sets_count_key(d),"
        " sets_removed_key(sets_count_key(d)), bloom_key(d), bloom_filter_key(bloom_key(d), 3),"
        " expiring_key(d), expiring_base_key(d, 12345),"
        " sets_bucket_key(expiring_base_key(d, 12345), 0, 5), hits_key(d), hits_crawls_key(d),"
        " hits_base_key(d, 'busy-board', 7)}\n"
    )
    found = [key.decode() for key in client.eval(script, 1, d)]
    assert found == [
        f"{d}:kind",
        f"{d}:2:17",
        f"{d}:count",
        f"{d}:count:removed",
        f"{d}:bloom",
        f"{d}:bloom:3",
        f"{d}:expiring",
        f"{d}:t:12345",
        f"{d}:t:12345:0:5",
        f"{d}:hits",
        f"{d}:crawls",
        f"{d}:h:busy-board:7",
    ]
    # the kinds written before are pinned; a new kind adds its own (test_kinds.py checks it)
    assert {kind: DEDUP_KEYS[kind] for kind in ("", *STORED)} == {
        "": {"kind": "string"},
        "exact": {"<n>:<n>": "set", "count": "counter", "count:removed": "counter"},
        "bloom": {"count": "counter", "bloom": "numbers", "bloom:<n>": None},
        "expiring": {
            "expiring": "numbers",
            "t:<n>:<n>:<n>": "set",
            "t:<n>:count": "counter",
            "t:<n>:count:removed": "counter",
        },
        "hits": {
            "count": "counter",
            "hits": "numbers",
            "crawls": "hash",
            "h:<source>:<n>": "set",
        },
    }


def test_the_generated_fragments_header_names_every_function_it_defines() -> None:
    """``dedup_keys.lua``'s header is written by hand: a new key's function is named there."""
    fragment = ROOT / "celery_crawl" / "dupefilter" / "lua" / "include" / "dedup_keys.lua"
    header = fragment.read_text().split("\n\n", 1)[0]
    listed = " ".join(line.removeprefix("--").strip() for line in header.splitlines())
    defined = re.findall(r"local function (\w+\([^)]*\))", lua_dedup_keys())
    named = re.findall(r"\w+\([^)]*\)", listed.split("Defines: ", 1)[1])
    assert named == defined
