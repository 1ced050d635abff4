"""``celery-crawl status``: the crawl at a glance, per spider, from Redis and Celery.

Per spider: queue length, in flight, dedup size, pages/s and items/s over the
last minute (from the per-minute counts the stats collector keeps), the
running jobs with their progress; and the Celery workers online.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis
from rich.console import Group
from rich.table import Table

from celery_crawl.exporter import read
from celery_crawl.jobs import parse_status
from celery_crawl.keys import SpiderKeys


def rates(client: redis.Redis, keys: SpiderKeys, now: float) -> dict[str, float]:
    """Pages and items per second over the last full minute plus the current one."""
    minute = int(now // 60)
    with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.stats_rate(minute - 1))
        pipe.hgetall(keys.stats_rate(minute))
        previous, current = pipe.execute()
    seconds = 60 + now % 60
    total = {k: int(previous.get(k, 0)) + int(current.get(k, 0)) for k in {*previous, *current}}
    return {
        "pages_per_s": round(total.get(b"response_received_count", 0) / seconds, 2),
        "items_per_s": round(total.get(b"item_scraped_count", 0) / seconds, 2),
    }


def running_jobs(client: redis.Redis, keys: SpiderKeys) -> list[dict[str, Any]]:
    ids = sorted(member.decode() for member in client.smembers(keys.active_jobs))  # type: ignore[union-attr]
    with client.pipeline(transaction=False) as pipe:
        for job in ids:
            pipe.hgetall(keys.job(job))
        raws = pipe.execute()
    found = [(job, raw) for job, raw in zip(ids, raws, strict=True) if raw]
    return [
        {k: v for k, v in parse_status(job, keys.spider, raw).as_dict().items() if k in PROGRESS}
        for job, raw in found
    ]


PROGRESS = ("job_id", "spider", "state", "queued", "in_flight", "done", "pages", "items")


def snapshot(client: redis.Redis, spiders: Sequence[SpiderKeys], app: Any) -> dict[str, Any]:
    """Everything the status screen shows, as plain data (``--json``)."""
    now = time.time()
    per_spider = []
    for reading in read(client, spiders):
        keys = reading.keys
        per_spider.append(
            {
                "spider": keys.spider,
                "queue": reading.queued,
                "in_flight": reading.in_flight,
                "dedup": reading.fingerprints,
                **rates(client, keys, now),
                "jobs": running_jobs(client, keys) if reading.jobs is not None else [],
            }
        )
    return {"spiders": per_spider, "workers": workers(app)}


def workers(app: Any, timeout: float = 1.0) -> list[str]:
    """Celery workers that answer a ping within ``timeout``."""
    replies = app.control.inspect(timeout=timeout).ping() or {}
    return sorted(replies)


def render(data: dict[str, Any]) -> Group:
    spiders = Table(title="celery_crawl status")
    for column in ("spider", "queue", "in flight", "dedup", "pages/s", "items/s", "jobs"):
        spiders.add_column(column, justify="left" if column == "spider" else "right")
    for s in data["spiders"]:
        spiders.add_row(
            s["spider"],
            f"{s['queue']:,}",
            f"{s['in_flight']:,}",
            f"{s['dedup']:,}",
            f"{s['pages_per_s']:.1f}",
            f"{s['items_per_s']:.1f}",
            str(len(s["jobs"])),
        )
    jobs = Table(title="running jobs")
    for column in PROGRESS:
        jobs.add_column(column.replace("_", " "))
    for s in data["spiders"]:
        for job in s["jobs"]:
            jobs.add_row(*(str(job[c]) for c in PROGRESS))
    online = Table(title=f"workers online: {len(data['workers'])}", show_header=False)
    for name in data["workers"]:
        online.add_row(name)
    return Group(spiders, jobs, online)
