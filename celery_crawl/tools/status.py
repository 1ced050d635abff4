"""``celery-crawl status``: the crawl at a glance, per spider, from Redis and Celery.

Per spider: queue length, in flight, dedup size, requests dropped because
they could not be queued (in the dead-letter list), pages/s and items/s over
the last minute (from the per-minute counts the stats collector keeps), the
running jobs with their progress (and "waiting: no live worker hosts ..."
while that is so); the Celery workers online; and the worker processes of the
registry, with the age of their last heartbeat; and per spider group, its
busiest sites: in flight, leased, waits for the limits, back-offs, pauses.
First, in red, when Redis is out of memory or has evicted keys (``INFO``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import redis
from rich.console import Group
from rich.markup import escape
from rich.table import Table

from celery_crawl.core import connection
from celery_crawl.core.bad_values import BadValues
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.hosting.project import project_of
from celery_crawl.hosting.registry import Registry, waiting_reason
from celery_crawl.jobs.handle import parse_status
from celery_crawl.jobs.store import server_time
from celery_crawl.politeness.sites import read_sites
from celery_crawl.tools.exporter import Reading, read, read_registry, read_schedules

Raw = dict[bytes, bytes]


def rates(
    previous: dict[str, int | None], current: dict[str, int | None], now: float
) -> dict[str, float]:
    """Pages and items per second over the last full minute plus the current one."""
    seconds = 60 + now % 60

    def total(field: str) -> int:
        return (previous.get(field) or 0) + (current.get(field) or 0)

    return {
        "pages_per_s": round(total("response_received_count") / seconds, 2),
        "items_per_s": round(total("item_scraped_count") / seconds, 2),
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

    Six pipelined round trips, whatever the number of spiders: the
    exporter's reading (on a cluster, with a script call per spider before
    it), then the per-minute counts and running job ids, then the running
    jobs' hashes, then the worker registry, then Redis's memory (INFO), then
    the sources on their own schedules. A
    value that is not what its key holds is skipped, and its key listed in
    ``bad_values`` (:mod:`celery_crawl.core.bad_values`).
    """
    now, bad = time.time(), BadValues()
    readings = read(client, spiders, bad)
    counts = minute_counts(client, readings, now, bad)
    jobs = running_jobs(
        client, [(r.keys, ids) for r, (_, ids) in zip(readings, counts, strict=True)], bad
    )
    processes = read_registry(client, Registry.from_settings(project_of(app).settings), bad)
    memory = connection.memory(client)
    for job in (job for spider_jobs in jobs for job in spider_jobs):
        job["waiting"] = waiting_reason(processes, job["spider"])
        if memory is not None and memory.out_of_memory:
            job["waiting"] = memory.describe()
    schedules = read_schedules(client, spiders, now)
    per_spider = [
        {
            "spider": reading.keys.spider,
            "queue": reading.queued,
            "in_flight": reading.in_flight,
            "dedup": reading.fingerprints,
            "dropped": reading.dropped,
            **spider_rates,
            "jobs": spider_jobs,
            "sources": asdict(schedule) if schedule is not None else None,
        }
        for reading, (spider_rates, _), spider_jobs, schedule in zip(
            readings, counts, jobs, schedules, strict=True
        )
    ]
    return {
        "spiders": per_spider,
        "sites": site_rows(client, spiders, bad),
        "workers": workers(app),
        "processes": [p.as_dict() for p in processes],
        "redis": redis_memory(memory),
        "bad_values": bad.as_list(),
    }


def redis_memory(memory: connection.Memory | None) -> dict[str, Any]:
    """Redis's memory as the status shows it; ``problem`` says what it does to the crawl."""
    if memory is None:  # INFO refused (an ACL): not known
        fields = ("used_memory", "maxmemory", "policy", "evicted_keys", "out_of_memory")
        return {**dict.fromkeys(fields), "problem": ""}
    problem = memory.describe() if memory.out_of_memory else ""
    if memory.evicted_keys and memory.policy != connection.SAFE_POLICY:
        problem = problem or (
            f"Redis evicted {memory.evicted_keys} keys (maxmemory-policy {memory.policy}):"
            " crawl keys among them are lost (jobs, queued requests)"
        )
    return {
        "used_memory": memory.used,
        "maxmemory": memory.maxmemory,
        "policy": memory.policy,
        "evicted_keys": memory.evicted_keys,
        "out_of_memory": memory.out_of_memory,
        "problem": problem,
    }


def site_rows(
    client: redis.Redis, spiders: Sequence[SpiderKeys], bad: BadValues
) -> list[dict[str, Any]]:
    """Every site of each spider group, busiest first (docs/politeness.md)."""
    rows = []
    for keys in (k for k in spiders if k.group == k.spider):
        rows += [{"group": keys.group, **asdict(r)} for r in read_sites(client, keys, bad)]
    return rows


def minute_counts(
    client: redis.Redis, readings: Sequence[Reading], now: float, bad: BadValues | None = None
) -> list[tuple[dict[str, float], list[str]]]:
    """Per spider, in one round trip: its rates, and the ids of the running jobs it reports."""
    bad, minute = BadValues() if bad is None else bad, int(now // 60)
    with client.pipeline(transaction=False) as pipe:
        for reading in readings:
            pipe.hgetall(reading.keys.stats_rate(minute - 1))
            pipe.hgetall(reading.keys.stats_rate(minute))
            pipe.smembers(reading.keys.active_jobs)
        replies = iter(pipe.execute(raise_on_error=False))
    counts = []
    for reading in readings:
        keys = reading.keys
        previous = bad.count_hash(keys.stats_rate(minute - 1), next(replies))
        current = bad.count_hash(keys.stats_rate(minute), next(replies))
        active = bad.reply(keys.active_jobs, next(replies)) or set()
        ids = [bad.text(keys.active_jobs, m, "job id") for m in active]
        own = reading.jobs is not None  # the group's own spider lists the group's jobs
        counts.append((rates(previous, current, now), sorted(i for i in ids if i and own)))
    return counts


def running_jobs(
    client: redis.Redis,
    spiders: Sequence[tuple[SpiderKeys, list[str]]],
    bad: BadValues | None = None,
) -> list[list[dict[str, Any]]]:
    """Per spider, in one round trip: the progress of each job id given (gone ones left out)."""
    bad = BadValues() if bad is None else bad
    with client.pipeline(transaction=False) as pipe:
        for keys, ids in spiders:
            for job in ids:
                pipe.hgetall(keys.job(job))
        replies = pipe.execute(raise_on_error=False)
    read_at, raws = server_time(client.time()), iter(replies)  # TIME: not in a cluster pipeline
    jobs = []
    for keys, ids in spiders:
        found = [(job, bad.reply(keys.job(job), next(raws))) for job in ids]
        shown = (progress(job, keys, raw, bad, read_at) for job, raw in found if raw)
        jobs.append([job for job in shown if job is not None])
    return jobs


def progress(
    job: str, keys: SpiderKeys, raw: Raw, bad: BadValues, read_at: float
) -> dict[str, Any] | None:
    """The job's progress; None, noted, when its hash cannot be read as a job's."""
    try:
        status = parse_status(job, keys.spider, raw, read_at).as_dict()
    except (ValueError, TypeError) as exc:
        bad.note(keys.job(job), f"not a job's hash: {exc}")
        return None
    return {k: v for k, v in status.items() if k in PROGRESS}


def workers(app: Any, timeout: float = 1.0) -> list[str]:
    """Celery workers that answer a ping within ``timeout``; none while the broker, a full
    Redis, refuses the ping (the status names that)."""
    try:
        replies = app.control.inspect(timeout=timeout).ping() or {}
    except redis.exceptions.OutOfMemoryError:
        return []
    return sorted(replies)


def render(data: dict[str, Any]) -> Group:
    spiders = Table(title="celery_crawl status")
    columns = (
        "spider",
        "queue",
        "in flight",
        "dedup",
        "dropped",
        "pages/s",
        "items/s",
        "jobs",
        "sources",
    )
    for column in columns:
        spiders.add_column(column, justify="left" if column == "spider" else "right")
    for s in data["spiders"]:
        spiders.add_row(
            s["spider"],
            amount(s["queue"]),
            amount(s["in_flight"]),
            amount(s["dedup"]),
            f"{s['dropped']:,}",
            f"{s['pages_per_s']:.1f}",
            f"{s['items_per_s']:.1f}",
            str(len(s["jobs"])),
            sources_cell(s["sources"]),
        )
    jobs = Table(title="running jobs")
    for column in PROGRESS:
        jobs.add_column(column.replace("_", " "))
    jobs.add_column("waiting")
    for s in data["spiders"]:
        for job in s["jobs"]:
            jobs.add_row(*(escape(str(job[c])) for c in PROGRESS), escape(job.get("waiting", "")))
    online = Table(title=f"workers online: {len(data['workers'])}", show_header=False)
    for name in data["workers"]:
        online.add_row(escape(name))
    tables = [spiders, jobs, site_table(data["sites"]), online, process_table(data["processes"])]
    tables[:0] = problem_tables(data["redis"]["problem"])
    if data["bad_values"]:
        tables.append(bad_value_table(data["bad_values"]))
    return Group(*tables)


def sources_cell(sources: dict[str, Any] | None) -> str:
    """How many sources, and how many are overdue (and for how long the oldest waited)."""
    if not sources or not sources["sources"]:
        return ""
    if not sources["overdue"]:
        return f"{sources['sources']:,}"
    late = f"{sources['overdue']:,} overdue, {sources['oldest_overdue']:.0f} s"
    return f"{sources['sources']:,} ({late})"


def problem_tables(problem: str) -> list[Table]:
    """Redis out of memory, or evicting keys: shown first, in red; nothing when all is well."""
    if not problem:
        return []
    table = Table(title="[red]Redis[/red]", show_header=False)
    table.add_row(f"[red]{escape(problem)}[/red]")
    return [table]


def amount(value: int | None) -> str:
    """A count; ``?`` when its key did not hold a number (listed under bad values)."""
    return "?" if value is None else f"{value:,}"


def bad_value_table(bad: list[dict[str, Any]]) -> Table:
    """The keys whose values were skipped: not what the key holds (docs/monitoring.md)."""
    table = Table(title=f"[red]bad values skipped: {len(bad)} keys[/red]")
    for column in ("key", "reason"):
        table.add_column(column)
    for row in bad:
        table.add_row(escape(row["key"]), escape(row["reason"]))
    return table


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
            escape(s["group"]),
            escape(s["site"]),
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
        spiders = escape(", ".join(p["spiders"]))
        table.add_row(escape(p["id"]), spiders, f"{p['heartbeat_age']:.1f} s ago", state)
    return table
