"""``celery-crawl status``: the crawl at a glance, per spider, from Redis and Celery.

Per spider: queue length, in flight, dedup size, requests dropped because
they could not be queued (in the dead-letter list), pages/s and items/s over
the last minute (from the per-minute counts the stats collector keeps), the
running jobs with their progress (and "waiting: no live worker hosts ..."
while that is so); the Celery workers online; and the worker processes of the
registry, with the age of their last heartbeat; and per spider group, its
busiest sites: in flight, leased, waits for the limits, back-offs, pauses.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import redis
from rich.console import Group
from rich.table import Table

from celery_crawl.exporter import Reading, read
from celery_crawl.jobs import parse_status, server_time
from celery_crawl.keys import SpiderKeys
from celery_crawl.project import project_of
from celery_crawl.registry import Registry, waiting_reason
from celery_crawl.sites import read_sites

Raw = dict[bytes, bytes]


def rates(previous: Raw, current: Raw, now: float) -> dict[str, float]:
    """Pages and items per second over the last full minute plus the current one."""
    seconds = 60 + now % 60
    total = {k: int(previous.get(k, 0)) + int(current.get(k, 0)) for k in {*previous, *current}}
    return {
        "pages_per_s": round(total.get(b"response_received_count", 0) / seconds, 2),
        "items_per_s": round(total.get(b"item_scraped_count", 0) / seconds, 2),
    }


PROGRESS = (
    "job_id",
    "spider",
    "state",
    "queued",
    "in_flight",
    "done",
    "pages",
    "items",
    "dropped",
)


def snapshot(client: redis.Redis, spiders: Sequence[SpiderKeys], app: Any) -> dict[str, Any]:
    """Everything the status screen shows, as plain data (``--json``).

    Four pipelined round trips, whatever the number of spiders: the
    exporter's reading (on a cluster, with a script call per spider before
    it), then the per-minute counts and running job ids, then the running
    jobs' hashes, then the worker registry.
    """
    now = time.time()
    readings = read(client, spiders)
    counts = minute_counts(client, readings, now)
    jobs = running_jobs(
        client, [(r.keys, ids) for r, (_, ids) in zip(readings, counts, strict=True)]
    )
    processes = Registry.from_settings(project_of(app).settings).read(client)
    for job in (job for spider_jobs in jobs for job in spider_jobs):
        job["waiting"] = waiting_reason(processes, job["spider"])
    per_spider = [
        {
            "spider": reading.keys.spider,
            "queue": reading.queued,
            "in_flight": reading.in_flight,
            "dedup": reading.fingerprints,
            "dropped": reading.dropped,
            **spider_rates,
            "jobs": spider_jobs,
        }
        for reading, (spider_rates, _), spider_jobs in zip(readings, counts, jobs, strict=True)
    ]
    return {
        "spiders": per_spider,
        "sites": site_rows(client, spiders),
        "workers": workers(app),
        "processes": [p.as_dict() for p in processes],
    }


def site_rows(client: redis.Redis, spiders: Sequence[SpiderKeys]) -> list[dict[str, Any]]:
    """Every site of each spider group, busiest first (docs/politeness.md)."""
    rows = []
    for keys in (k for k in spiders if k.group == k.spider):
        rows += [{"group": keys.group, **asdict(r)} for r in read_sites(client, keys)]
    return rows


def minute_counts(
    client: redis.Redis, readings: Sequence[Reading], now: float
) -> list[tuple[dict[str, float], list[str]]]:
    """Per spider, in one round trip: its rates, and the ids of the running jobs it reports."""
    minute = int(now // 60)
    with client.pipeline(transaction=False) as pipe:
        for reading in readings:
            pipe.hgetall(reading.keys.stats_rate(minute - 1))
            pipe.hgetall(reading.keys.stats_rate(minute))
            pipe.smembers(reading.keys.active_jobs)
        replies = iter(pipe.execute())
    counts = []
    for reading in readings:
        previous, current, active = next(replies), next(replies), next(replies)
        ids = sorted(m.decode() for m in active) if reading.jobs is not None else []  # group's own
        counts.append((rates(previous, current, now), ids))
    return counts


def running_jobs(
    client: redis.Redis, spiders: Sequence[tuple[SpiderKeys, list[str]]]
) -> list[list[dict[str, Any]]]:
    """Per spider, in one round trip: the progress of each job id given (gone ones left out)."""
    with client.pipeline(transaction=False) as pipe:
        for keys, ids in spiders:
            for job in ids:
                pipe.hgetall(keys.job(job))
        pipe.time()
        *replies, now = pipe.execute()
    read_at, raws = server_time(now), iter(replies)
    jobs = []
    for keys, ids in spiders:
        found = [(job, raw) for job, raw in ((job, next(raws)) for job in ids) if raw]
        jobs.append([progress(job, keys, raw, read_at) for job, raw in found])
    return jobs


def progress(job: str, keys: SpiderKeys, raw: Raw, read_at: float) -> dict[str, Any]:
    status = parse_status(job, keys.spider, raw, read_at).as_dict()
    return {k: v for k, v in status.items() if k in PROGRESS}


def workers(app: Any, timeout: float = 1.0) -> list[str]:
    """Celery workers that answer a ping within ``timeout``."""
    replies = app.control.inspect(timeout=timeout).ping() or {}
    return sorted(replies)


def render(data: dict[str, Any]) -> Group:
    spiders = Table(title="celery_crawl status")
    columns = ("spider", "queue", "in flight", "dedup", "dropped", "pages/s", "items/s", "jobs")
    for column in columns:
        spiders.add_column(column, justify="left" if column == "spider" else "right")
    for s in data["spiders"]:
        spiders.add_row(
            s["spider"],
            f"{s['queue']:,}",
            f"{s['in_flight']:,}",
            f"{s['dedup']:,}",
            f"{s['dropped']:,}",
            f"{s['pages_per_s']:.1f}",
            f"{s['items_per_s']:.1f}",
            str(len(s["jobs"])),
        )
    jobs = Table(title="running jobs")
    for column in PROGRESS:
        jobs.add_column(column.replace("_", " "))
    jobs.add_column("waiting")
    for s in data["spiders"]:
        for job in s["jobs"]:
            jobs.add_row(*(str(job[c]) for c in PROGRESS), job.get("waiting", ""))
    online = Table(title=f"workers online: {len(data['workers'])}", show_header=False)
    for name in data["workers"]:
        online.add_row(name)
    return Group(spiders, jobs, site_table(data["sites"]), online, process_table(data["processes"]))


SHOWN_SITES = 10  # the busiest; --json lists every site


def site_table(sites: list[dict[str, Any]]) -> Table:
    """The busiest sites: in flight, paused, leased, waits and back-offs."""
    more = f", the {SHOWN_SITES} busiest shown" if len(sites) > SHOWN_SITES else ""
    table = Table(title=f"sites: {len(sites)}{more}")
    columns = ("group", "site", "in flight", "leased", "waited", "back-offs", "paused for")
    for column in columns:
        table.add_column(column, justify="left" if column in ("group", "site") else "right")
    for s in sites[:SHOWN_SITES]:
        paused = f"[red]{s['paused_for']:.0f} s[/red]" if s["paused_for"] > 0 else "-"
        table.add_row(
            s["group"],
            s["site"],
            f"{s['in_flight']:,}",
            f"{s['leased']:,}",
            f"{s['parked']:,}",
            f"{s['backoffs']:,}",
            paused,
        )
    return table


def process_table(processes: list[dict[str, Any]]) -> Table:
    """The worker registry: each process, its spiders, the age of its last heartbeat."""
    live = sum(1 for p in processes if p["live"])
    table = Table(title=f"worker processes: {live} live")
    for column in ("process", "spiders", "heartbeat", "state"):
        table.add_column(column)
    for p in processes:
        state = "live" if p["live"] else "[red]lost[/red]"
        table.add_row(p["id"], ", ".join(p["spiders"]), f"{p['heartbeat_age']:.1f} s ago", state)
    return table
