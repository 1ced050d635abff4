"""The names of a dedup filter's keys, by kind, and the type each holds.

Each key of a filter is ``D:<name>`` under the spider's dupefilter key ``D``
(``SpiderKeys.dupefilter``; its count ``D:count`` is ``SpiderKeys.dupefilter_count``).
The names below, the layout of each kind (:data:`DEDUP_KEYS`, by which the repair of
damaged keys types them) and the Lua functions that build them (:func:`lua_dedup_keys`,
generated into ``dupefilter/lua/include/dedup_keys.lua``, so that no fragment builds a
name by hand) are made from the same parts. The kinds are those of
:data:`celery_crawl.dupefilter.filters.KINDS`; ``""`` holds the keys of every kind.

The repair of damaged keys (:mod:`celery_crawl.core.repair`) is a layer below and may
not import this package: this module hands it :func:`filter_keys` as it is imported
(:func:`celery_crawl.core.repair.find_keys_with`). Every process that can write these
keys has imported it, since the scripts that write them are built with the fragments
that :mod:`celery_crawl.dupefilter.filters` names, and that module imports this one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import redis

from celery_crawl.core.keys import DEDUP_COUNT, SpiderKeys, key_name
from celery_crawl.core.repair import find_keys_with, scan_keys
from celery_crawl.core.scripts import lua_value

DEDUP_KIND_KEY = "kind"  # the filter kind claimed by the first process that opens it
DEDUP_REMOVED = "removed"  # of those counted, removed since: <count>:removed
DEDUP_BLOOM = "bloom"  # a bloom filter's geometry; its sub-filters are bloom:<i>
DEDUP_EXPIRING = "expiring"  # an expiring filter's geometry
DEDUP_TIME = "t"  # an expiring filter's time bucket t:<t>, a set of buckets with its count
DEDUP_HITS = "hits"  # a hit-expiring filter's parameters (crawls)
DEDUP_CRAWLS = "crawls"  # a hit-expiring filter's crawls so far, by source
DEDUP_CRAWL = "h"  # a hit-expiring filter's crawl h:<source>:<n>: a set


# The keys of a dedup filter, by kind, with the type each holds (as
# core/lua/include/keytypes.lua names them). <n> in a name stands for a number: a
# generation, a bucket, a sub-filter, a time bucket. None: the filter's key, left to the
# script that names it when damaged (a bloom sub-filter's bits, sized by its hash).
_BUCKETS = key_name("<n>", "<n>")  # a set of buckets: <generation>:<bucket> under its base
_TIME_BASE = key_name(DEDUP_TIME, "<n>")
DEDUP_KEYS: dict[str, dict[str, str | None]] = {
    "": {DEDUP_KIND_KEY: "string"},
    "exact": {
        _BUCKETS: "set",
        DEDUP_COUNT: "counter",
        key_name(DEDUP_COUNT, DEDUP_REMOVED): "counter",
    },
    "bloom": {
        DEDUP_COUNT: "counter",
        DEDUP_BLOOM: "numbers",
        key_name(DEDUP_BLOOM, "<n>"): None,
    },
    "expiring": {
        DEDUP_EXPIRING: "numbers",
        key_name(_TIME_BASE, _BUCKETS): "set",
        key_name(_TIME_BASE, DEDUP_COUNT): "counter",
        key_name(_TIME_BASE, DEDUP_COUNT, DEDUP_REMOVED): "counter",
    },
    "hits": {
        DEDUP_COUNT: "counter",
        DEDUP_HITS: "numbers",
        DEDUP_CRAWLS: "hash",
        key_name(DEDUP_CRAWL, "<source>", "<n>"): "set",
    },
}


def lua_dedup_keys() -> str:
    """The Lua functions that name a dedup filter's keys (``dupefilter/lua/include``), made
    from the same parts as :data:`DEDUP_KEYS`: ``dedup`` is a dupefilter key, ``base`` the
    base of a set of buckets (the filter's key, or an expiring filter's time bucket)."""
    sep = lua_value(":")
    functions = {
        "dedup_kind_key(dedup)": f"dedup .. {lua_value(':' + DEDUP_KIND_KEY)}",
        "sets_bucket_key(base, generation, bucket)": (
            f"base .. {sep} .. generation .. {sep} .. bucket"
        ),
        "sets_count_key(base)": f"base .. {lua_value(':' + DEDUP_COUNT)}",
        "sets_removed_key(count)": f"count .. {lua_value(':' + DEDUP_REMOVED)}",
        "bloom_key(dedup)": f"dedup .. {lua_value(':' + DEDUP_BLOOM)}",
        "bloom_filter_key(bloom, i)": f"bloom .. {sep} .. i",
        "expiring_key(dedup)": f"dedup .. {lua_value(':' + DEDUP_EXPIRING)}",
        "expiring_base_key(dedup, t)": (
            f"dedup .. {lua_value(':' + DEDUP_TIME + ':')} .. string.format('%d', t)"
        ),
        "hits_key(dedup)": f"dedup .. {lua_value(':' + DEDUP_HITS)}",
        "hits_crawls_key(dedup)": f"dedup .. {lua_value(':' + DEDUP_CRAWLS)}",
        "hits_base_key(dedup, source, n)": (
            f"dedup .. {lua_value(':' + DEDUP_CRAWL + ':')} .. source .. {sep}"
            " .. string.format('%d', n)"
        ),
    }
    return "\n".join(
        f"local function {head}\n    return {body}\nend" for head, body in functions.items()
    )


def dedup_key_types(dupefilter: str, names: Iterable[str]) -> dict[str, str]:
    """Those of ``names`` that are keys of the dedup filter at ``dupefilter``, of whichever
    kind, with the type each must hold (:data:`DEDUP_KEYS`); the others are left out."""
    layouts = [
        (re.compile(re.escape(f"{dupefilter}:") + _dedup_pattern(name)), kind)
        for layout in DEDUP_KEYS.values()
        for name, kind in layout.items()
        if kind is not None
    ]
    found: dict[str, str] = {}
    for key in names:
        kind = next((kind for pattern, kind in layouts if pattern.fullmatch(key)), None)
        if kind is not None:
            found[key] = kind
    return found


def _dedup_pattern(name: str) -> str:
    """A regular expression for a name of :data:`DEDUP_KEYS`: ``<n>`` is a number,
    ``<source>`` a source id (no colon) or ``-``, no source."""
    parts = {"<n>": r"\d+", "<source>": r"[A-Za-z0-9_.-]+"}
    return ":".join(parts.get(part, re.escape(part)) for part in name.split(":"))


@find_keys_with
def filter_keys(client: redis.Redis, keys: SpiderKeys) -> dict[str, str]:
    """The spider's dedup filter's keys in Redis, of whichever kind, each with its type:
    for the repair of damaged keys."""
    return dedup_key_types(keys.dupefilter, scan_keys(client, keys.dupefilter + ":*"))
