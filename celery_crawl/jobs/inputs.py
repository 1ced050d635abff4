"""What a caller may give a job, checked once, where it enters, before anything is written.

``crawl()``, the ``celery-crawl crawl`` command, the producer and the job
task (whose arguments come from a Celery message) all check a job's input
with :func:`check_job`; a refusal raises :class:`~celery_crawl.core.errors.BadInput`
(a ``ValueError``) and writes nothing to Redis, nor sends a task.

- **Job ids**: 1 to :data:`~celery_crawl.core.entries.MAX_JOB_ID` (63) characters (a queue
  entry's limit) of ``A-Z a-z 0-9 _ . -``, the first a letter or digit. Ids never
  start with ``~`` nor hold ``:``, so no id names one of the job prefix's own keys
  (``~states``, ``~active``, ``~ended:…``) or another job's (``<id>:participants``,
  ``<id>:done``): ids have their own namespace. uuid4 strings, with or without
  dashes, are ids.
- **Seeds**: a list (or tuple) of at most :data:`MAX_SEEDS` JSON values, each
  at most :data:`MAX_SEED_BYTES` as JSON, all together :data:`MAX_SEEDS_BYTES`:
  a string is not a list of seeds.
- **Priority**: an integer (not a bool) within ±:data:`MAX_PRIORITY`.
- **Limits**: checked by :func:`celery_crawl.jobs.limits.check_limits`: names of
  ``celery_crawl.jobs.limits.LIMITS``; numbers, finite, not negative, at most
  :data:`MAX_LIMIT`; 0 or None means no limit; every limit but ``seconds`` a whole number.
- **Spider arguments**: at most :data:`MAX_ARGS`, names identifiers, values
  strings of at most :data:`MAX_SEED_BYTES` bytes as JSON.

Every message quotes the input it refuses, cut to a readable length
(:func:`celery_crawl.core.errors.quote`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_crawl.core.entries import MAX_JOB_ID
from celery_crawl.core.errors import BadInput, quote
from celery_crawl.jobs.limits import check_limits

JOB_ID = re.compile(f"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_JOB_ID - 1}}}")
MAX_SPIDER_NAME = 200
MAX_PRIORITY = 2**31 - 1
MAX_SEEDS = 10_000
MAX_SEED_BYTES = 16 * 1024
MAX_SEEDS_BYTES = 1024 * 1024
MAX_ARGS = 100


@dataclass(frozen=True)
class JobInput:
    """A job's input, checked."""

    spider: str
    seeds: list[Any]
    priority: int
    job_id: str
    limits: dict[str, float]
    args: dict[str, str]
    source: str = ""  # the source of the producer's schedule the job crawls; "" none
    # when the schedule made that source due, and when a tick reserved it (unix s); 0 none
    due_at: float = 0.0
    reserved_at: float = 0.0


def check_job(
    spider: Any,
    seeds: Any,
    *,
    priority: Any,
    job_id: Any,
    limits: Any,
    args: Any,
    source: Any = "",
) -> JobInput:
    """Every rule of this module over one job's input; raises :class:`BadInput`."""
    return JobInput(
        check_spider_name(spider),
        check_seeds(seeds),
        check_priority(priority),
        check_job_id(job_id),
        check_limits(limits),
        check_args(args),
        check_source(source),
    )


def check_source(source: Any) -> str:
    """A job's source: "" (none), or a source id (:func:`check_source_id`)."""
    if source == "" or source is None:
        return ""
    return check_source_id(source)


def check_source_id(source_id: Any) -> str:
    """Source ids follow the job ids' rule: they name keys and show in logs."""
    if not isinstance(source_id, str) or not JOB_ID.fullmatch(source_id):
        raise BadInput(
            f"source id {quote(source_id)}: 1 to {MAX_JOB_ID} characters of A-Z a-z 0-9 _ . -,"
            " the first a letter or digit"
        )
    return source_id


def check_spider_name(spider: Any) -> str:
    if not isinstance(spider, str) or not 0 < len(spider) <= MAX_SPIDER_NAME:
        raise BadInput(f"spider {quote(spider)}: a spider's name, as a non-empty str")
    return spider


def check_job_id(job_id: Any) -> str:
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise BadInput(
            f"job id {quote(job_id)}: 1 to {MAX_JOB_ID} characters of A-Z a-z 0-9 _ . -,"
            " the first a letter or digit"
        )
    return job_id


def check_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise BadInput(f"priority {quote(priority)}: an integer (e.g. 10, or -5), as Scrapy's")
    if abs(priority) > MAX_PRIORITY:
        raise BadInput(f"priority {priority}: at most {MAX_PRIORITY:,} either way")
    return priority


def check_seeds(seeds: Any) -> list[Any]:
    if not isinstance(seeds, list | tuple):
        raise BadInput(
            f"seeds {quote(seeds)}: a list of seeds, not a {type(seeds).__name__}"
            " (crawl(spider, [seed, ...]))"
        )
    if len(seeds) > MAX_SEEDS:
        raise BadInput(f"{len(seeds):,} seeds: a job takes at most {MAX_SEEDS:,}; start more jobs")
    total = sum(seed_size(index, seed) for index, seed in enumerate(seeds))
    if total > MAX_SEEDS_BYTES:
        raise BadInput(f"seeds of {total:,} bytes as JSON: a job takes at most {MAX_SEEDS_BYTES:,}")
    return list(seeds)


def seed_size(index: int, seed: Any) -> int:
    """Bytes of ``seed`` as JSON, as the job's hash and its task message hold it."""
    try:
        size = len(json.dumps(seed, allow_nan=False, separators=(",", ":")).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadInput(f"seed {index} {quote(seed)}: not JSON data ({quote(str(exc))})") from None
    if size > MAX_SEED_BYTES:
        raise BadInput(
            f"seed {index} {quote(seed)}: {size:,} bytes as JSON, at most {MAX_SEED_BYTES:,}"
        )
    return size


def check_args(args: Any) -> dict[str, str]:
    """Spider arguments are strings, as on Scrapy's command line."""
    if args is None:
        return {}
    if not isinstance(args, Mapping) or len(args) > MAX_ARGS:
        raise BadInput(f"spider arguments {quote(args)}: a dict of at most {MAX_ARGS} NAME: str")
    for name, value in args.items():
        if not (isinstance(name, str) and name.isidentifier() and isinstance(value, str)):
            raise BadInput(
                f"spider argument {quote(name)}={quote(value)}: names are identifiers, values str"
            )
        if len(name) > MAX_SPIDER_NAME or len(json.dumps(value)) > MAX_SEED_BYTES:
            raise BadInput(
                f"spider argument {quote(name)}={quote(value)}: at most {MAX_SEED_BYTES:,} bytes"
            )
    return dict(args)
