"""A job's limits: the one table of them, their checks, and who enforces each.

A limit has Scrapy's meaning (``CLOSESPIDER_*``, ``DEPTH_LIMIT``) for one job.
Each is enforced where what it counts is known, and asks this module what to do:

- ``pages``, ``items``, ``errors``: by Redis, as the job's counters grow
  (``job_check_limits`` in ``jobs/lua/include/jobs.lua``, whose table of reasons is
  generated from :data:`LIMITS`, :func:`lua_tables`);
- ``seconds``: by the job's tracker (the Celery task), on Redis's clock
  (:meth:`celery_crawl.jobs.store.JobStore.end_if_out_of_time`), when
  :func:`time_limited` says so;
- ``depth``: by the spider middleware (``celery_crawl.hosting.middleware.JobDepthMiddleware``),
  which reads the job's depth limit from a response with :func:`depth_limit`.

A job's input is checked here too (:func:`check_limits`): names of :data:`LIMITS`;
numbers, finite, not negative, at most :data:`MAX_LIMIT`; 0 or None means no limit;
every limit but ``seconds`` a whole number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from celery_crawl.core.defaults import SETTINGS
from celery_crawl.core.errors import BadInput, quote
from celery_crawl.jobs.signals import JOB_DEPTH_META


class Limit(NamedTuple):
    setting: str  # the CLOSESPIDER_* (or DEPTH_LIMIT) setting that gives a spider's default
    reason: str  # a closed job's reason when reached, Scrapy's; "" for no reason to close
    counts: str  # what it counts, for help texts (:func:`describe`)


LIMITS = {
    "pages": Limit("CLOSESPIDER_PAGECOUNT", "closespider_pagecount", "pages crawled"),
    "items": Limit("CLOSESPIDER_ITEMCOUNT", "closespider_itemcount", "items scraped"),
    "seconds": Limit("CLOSESPIDER_TIMEOUT", "closespider_timeout", "seconds since the start"),
    "errors": Limit("CLOSESPIDER_ERRORCOUNT", "closespider_errorcount", "callback errors"),
    # not a reason to close: requests deeper than this are not followed (DEPTH_LIMIT)
    "depth": Limit("DEPTH_LIMIT", "", "links followed from a seed"),
}
# the limits Redis checks as the job's field of that name grows (errors: callback errors)
COUNTED = ("pages", "items", "errors")
FRACTIONAL_LIMITS = ("seconds",)  # the others count whole things (check_limits)
MAX_LIMIT = 2**53  # Lua counts in doubles: exact up to here
FIELD_PREFIX = "limit/"  # a job hash's field of a limit: limit/<name>


def limit_fields(limits: dict[str, float]) -> dict[str, str]:
    """The job hash fields of ``limits`` (names of :data:`LIMITS`); 0 or None means no limit."""
    unknown = set(limits) - set(LIMITS)
    if unknown:
        raise ValueError(f"unknown job limits {sorted(unknown)}: use {', '.join(LIMITS)}")
    return {
        f"{FIELD_PREFIX}{name}": format(float(value), "g")
        for name, value in limits.items()
        if value
    }


def from_settings(settings: Any) -> dict[str, float]:
    """A spider's own limits, from its ``CLOSESPIDER_*`` and ``DEPTH_LIMIT`` settings (or
    a setting of ours, with its default, for a limit Scrapy has none for)."""
    return {name: _read(settings, limit.setting) for name, limit in LIMITS.items()}


def _read(settings: Any, name: str) -> float:
    entry = SETTINGS.get(name)  # ours: its registered default; Scrapy's: 0, none
    return float(settings.getfloat(name, entry.default if entry is not None else 0.0))


def describe() -> str:
    """The limits, for help texts: each name, what it counts, the setting of its default,
    and what reaching it does."""
    each = ", ".join(f"{name} ({limit.counts}, {limit.setting})" for name, limit in LIMITS.items())
    closing = {name: limit.reason for name, limit in LIMITS.items() if limit.reason}
    others = _listed([name for name, limit in LIMITS.items() if not limit.reason])
    return (
        f"{each}. Reaching {_listed(list(closing))} ends the job closed, with that"
        f" limit's reason ({', '.join(closing.values())}); beyond {others}, requests are"
        " not followed"
    )


def _listed(names: list[str]) -> str:
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def time_limited(limits: dict[str, float] | None, finished: bool) -> float:
    """The ``seconds`` limit the tracker has Redis check now; 0: none to check."""
    limit = (limits or {}).get("seconds")
    return 0.0 if finished or not limit else limit


def depth_limit(response: Any) -> int:
    """The depth limit of the job of ``response`` (0: none), set on its requests when leased."""
    return int(response.meta.get(JOB_DEPTH_META) or 0)


def check_limits(limits: Any) -> dict[str, float]:
    """The limits as numbers; 0 (or None) stays: it lifts the spider's own limit."""
    if limits is None:
        return {}
    if not isinstance(limits, Mapping):
        raise BadInput(f"limits {quote(limits)}: a dict of limit name -> number")
    return {check_limit_name(name): check_limit(name, value) for name, value in limits.items()}


def check_limit_name(name: Any) -> str:
    if name not in LIMITS:
        raise BadInput(f"job limit {quote(name)}: the limits are {', '.join(LIMITS)}")
    return str(name)


def check_limit(name: str, value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(f"job limit {name}={quote(value)}: a number")
    if not (math.isfinite(value) and value >= 0):
        raise BadInput(f"job limit {name}={value}: a finite number, 0 (no limit) or more")
    if value > MAX_LIMIT:
        raise BadInput(f"job limit {name}={value}: at most 2**53")
    if name not in FRACTIONAL_LIMITS and not float(value).is_integer():
        raise BadInput(f"job limit {name}={value}: a whole number")
    return float(value)


def counted_reasons() -> dict[str, str]:
    """The limits Redis checks as counters grow, each with its reason (Lua's ``LIMITED``)."""
    return {name: LIMITS[name].reason for name in COUNTED}
