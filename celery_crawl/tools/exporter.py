"""Prometheus metrics of the crawl, read from Redis at each scrape.

``celery-crawl exporter --port 9410`` serves ``/metrics``. Everything is in
Redis, so one exporter serves the whole cluster. A scrape sends a fixed
handful of commands per spider in one pipelined round trip, whatever the
number of queued requests or fingerprints: one short script gives the queue
length (over its priority levels) and the dedup size (as the dupefilter package's
``include/dedup_size.lua`` reads a filter of any kind); the stats and the job counts
are one hash each. No ``KEYS``, no scans. Once a scrape, ``INFO memory`` and
``INFO stats`` give Redis's memory and evictions.

A value that is not what its key holds (text where a count belongs, bytes
that are not UTF-8, a key of the wrong type) never fails a scrape: its key
is logged once, counted in ``celery_crawl_exporter_bad_values_total{key}``,
and its series left out; every other series is served
(:mod:`celery_crawl.core.bad_values`).

Every metric is named ``celery_crawl_*`` and labelled with ``spider``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from celery_crawl.core import connection, scripts
from celery_crawl.core.bad_values import BadValues
from celery_crawl.core.errors import quote
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.hosting.middleware import LAST_RESPONSE
from celery_crawl.hosting.registry import Registry, WorkerInfo, hosts
from celery_crawl.politeness.sites import SiteReading, read_sites
from celery_crawl.tools.http_server import Answer, BoundedHTTPServer

logger = logging.getLogger(__name__)
NS = "celery_crawl"
DROPPED = "scheduler/dropped/"  # stats field prefix of requests that could not be queued

# stats hash field -> (metric, help): plain counters per spider
COUNTERS = {
    "downloader/request_count": ("requests", "Requests sent to the downloader."),
    "downloader/response_bytes": ("response_bytes", "Bytes of responses received."),
    "item_scraped_count": ("items", "Items scraped."),
    "retry/count": ("retries", "Requests retried."),
    "scheduler/requeued/expired": ("requeued_expired", "Leases that expired and were requeued."),
    "producer/produced": ("producer_produced", "Jobs the producer started."),
    "producer/held_back": ("producer_held_back", "Jobs the producer held back (caps)."),
    "producer/skipped_running": (
        "producer_skipped_running",
        "Sources skipped because their job still ran.",
    ),
}
# stats hash field prefix -> (metric, label, help): counters per spider and label
LABELLED = {
    "downloader/response_status_count/": ("responses", "status", "Responses by HTTP status."),
    "downloader/exception_type_count/": ("errors", "kind", "Download errors and callback errors."),
    "spider_exceptions/": ("errors", "kind", "Download errors and callback errors."),
    "celery_crawl/dead_letter/": ("dead_lettered", "reason", "Queue entries dead-lettered."),
    DROPPED: (
        "dropped",
        "kind",
        "Requests that could not be queued (dead-lettered with the reason).",
    ),
}
JOB_GAUGES = ("queued", "running")  # current counts
JOB_COUNTERS = ("done", "incomplete", "failed", "cancelled", "closed")  # only grow


@dataclass
class Reading:
    """What one scrape read for one spider; None where the value in Redis was bad."""

    keys: SpiderKeys
    queued: int | None
    in_flight: int | None
    fingerprints: int | None
    stats: dict[str, str]
    jobs: dict[str, int | None] | None  # None for a group member: its group's spider reports jobs

    @property
    def dropped(self) -> int:
        """Requests of this spider that could not be queued, over every kind."""
        fields = (v for k, v in self.stats.items() if k.startswith(DROPPED))
        return int(sum(number(v) for v in fields))


def read(
    client: redis.Redis, spiders: Sequence[SpiderKeys], bad: BadValues | None = None
) -> list[Reading]:
    """One pipelined round trip: three or four commands per spider, none of them O(queue).

    ``tools/lua/spider_size.lua`` gives a spider's queue length and dedup size. A
    group's job counts are read once, with the spider named after the group.
    On a Redis Cluster, whose pipelines take no scripts, the sizes are read
    first, one call per spider, each on the spider's node. A value that is
    not what its key holds is noted in ``bad`` and skipped.
    """
    bad = BadValues() if bad is None else bad
    size = scripts.script(client, "spider_size")
    cluster = connection.is_cluster(client)
    sizes = [cluster_size(size, keys) for keys in spiders] if cluster else []
    with client.pipeline(transaction=False) as pipe:
        for keys in spiders:
            if not cluster:
                size(keys=size_keys(keys), args=[], client=pipe)
            pipe.zcard(keys.inflight)
            pipe.hgetall(keys.stats)
            if keys.group == keys.spider:
                pipe.hgetall(keys.job_states)
        replies = pipe.execute(raise_on_error=False)
    return parse_readings(spiders, iter(replies), iter(sizes) if cluster else None, bad)


def cluster_size(size: Any, keys: SpiderKeys) -> Any:
    """The script's reply on a cluster node, or its error, as a pipeline gives it."""
    try:
        return size(keys=size_keys(keys))
    except redis.ResponseError as exc:
        return exc


def size_keys(keys: SpiderKeys) -> list[str]:
    return [keys.queue, keys.dupefilter, keys.dupefilter_count]


def parse_readings(
    spiders: Sequence[SpiderKeys],
    replies: Iterator[Any],
    sizes: Iterator[Any] | None,
    bad: BadValues,
) -> list[Reading]:
    readings = []
    for keys in spiders:
        queued, count = parse_sizes(keys, next(replies if sizes is None else sizes), bad)
        in_flight, stats = bad.reply(keys.inflight, next(replies)), next(replies)
        jobs = next(replies) if keys.group == keys.spider else None
        readings.append(
            Reading(
                keys,
                queued,
                in_flight,
                count,
                bad.text_hash(keys.stats, stats),
                None if jobs is None else bad.count_hash(keys.job_states, jobs),
            )
        )
    return readings


def parse_sizes(keys: SpiderKeys, reply: Any, bad: BadValues) -> tuple[int | None, int | None]:
    """The queue length and the dedup size; a count that is not a number ends the
    script's reply early (a Lua nil ends a table), so that it holds the queue length only."""
    found = bad.reply(f"{keys.queue} (or its levels, or {keys.dupefilter})", reply)
    if found is None:
        return None, None
    if len(found) < 2:
        bad.note(keys.dupefilter_count, "not a number")
        return int(found[0]), None
    return int(found[0]), int(found[1])


class CrawlCollector(Collector):
    """A prometheus_client collector over the spiders' Redis keys."""

    def __init__(
        self,
        client: redis.Redis,
        spiders: Sequence[SpiderKeys],
        registry: Registry | None = None,
    ) -> None:
        self.client = client
        self.spiders = list(spiders)
        self.registry = registry
        self.bad = BadValues()  # over the exporter's life: each bad key is logged once

    def collect(self) -> Iterator[Metric]:
        readings = read(self.client, self.spiders, self.bad)
        yield from gauges(readings, self.bad)
        yield from counters(readings)
        yield from job_metrics(readings)
        yield from schedule_metrics(self.client, self.spiders, time.time())
        groups = [keys for keys in self.spiders if keys.group == keys.spider]
        sites = {keys.group: read_sites(self.client, keys, self.bad) for keys in groups}
        yield from site_metrics(sites)
        if self.registry is not None:
            workers = read_registry(self.client, self.registry, self.bad)
            yield from worker_metrics(workers, self.spiders)
        yield from memory_metrics(connection.memory(self.client))
        yield bad_value_metric(self.bad)


@dataclass(frozen=True)
class ScheduleReading:
    """A spider's sources on their own schedules, as one scrape read them."""

    sources: int
    overdue: int  # due, and no job yet: the caps hold them back, or the producer is not ticking
    oldest_overdue: float  # seconds the source due the longest has waited; 0 if none waits


def read_schedules(
    client: redis.Redis, spiders: Sequence[SpiderKeys], now: float
) -> list[ScheduleReading | None]:
    """One pipelined round trip, three O(log n) commands per spider; ``now`` is the reader's
    clock. None for a spider whose keys are of another type (the producer repairs them)."""
    now_ms = int(now * 1000)
    with client.pipeline(transaction=False) as pipe:
        for keys in spiders:
            pipe.hlen(keys.schedule_sources)
            pipe.zcount(keys.schedule_due, "-inf", now_ms)
            pipe.zrange(keys.schedule_due, 0, 0, withscores=True)
        replies = iter(pipe.execute(raise_on_error=False))
    found: list[ScheduleReading | None] = []
    for _ in spiders:
        count, due, first = next(replies), next(replies), next(replies)
        if any(isinstance(reply, Exception) for reply in (count, due, first)):
            found.append(None)
            continue
        waited = (now_ms - first[0][1]) / 1000 if first and due else 0.0
        found.append(ScheduleReading(int(count), int(due), max(waited, 0.0)))
    return found


def schedule_metrics(
    client: redis.Redis, spiders: Sequence[SpiderKeys], now: float
) -> Iterator[Metric]:
    """Sources on their own schedules: how many, how many overdue, the longest wait."""
    labels = ["spider"]
    total = GaugeMetricFamily(f"{NS}_sources", "Sources on their own schedules.", labels=labels)
    overdue = GaugeMetricFamily(
        f"{NS}_sources_overdue", "Sources due that have no job yet.", labels=labels
    )
    oldest = GaugeMetricFamily(
        f"{NS}_sources_oldest_overdue_seconds",
        "How long the source due the longest has waited for its job (0: none waits).",
        labels=labels,
    )
    for keys, reading in zip(spiders, read_schedules(client, spiders, now), strict=True):
        if reading is not None:
            total.add_metric([keys.spider], reading.sources)
            overdue.add_metric([keys.spider], reading.overdue)
            oldest.add_metric([keys.spider], reading.oldest_overdue)
    yield from (total, overdue, oldest)


def memory_metrics(memory: connection.Memory | None) -> Iterator[Metric]:
    """Redis's memory (INFO): at its ``maxmemory`` it refuses writes and the crawl waits;
    under an evicting policy it drops keys, crawl keys among them. None: INFO refused."""
    if memory is None:
        return
    full = GaugeMetricFamily(
        f"{NS}_redis_out_of_memory",
        "1 while Redis is at its maxmemory and refuses writes: the crawl waits for room.",
    )
    full.add_metric([], float(memory.out_of_memory))
    used = GaugeMetricFamily(f"{NS}_redis_used_memory_bytes", "Memory Redis uses.")
    used.add_metric([], memory.used)
    limit = GaugeMetricFamily(f"{NS}_redis_maxmemory_bytes", "Redis's maxmemory (0: no limit).")
    limit.add_metric([], memory.maxmemory)
    evicted = CounterMetricFamily(
        f"{NS}_redis_evicted_keys",
        "Keys Redis evicted for memory (an evicting maxmemory-policy): crawl keys are lost so.",
    )
    evicted.add_metric([], memory.evicted_keys)
    yield from (full, used, limit, evicted)


def read_registry(client: redis.Redis, registry: Registry, bad: BadValues) -> list[WorkerInfo]:
    """The worker registry; none, noted, when its key is of the wrong type."""
    try:
        return registry.read(client)
    except redis.ResponseError as exc:
        bad.note(registry.key, f"read failed: {exc}")
        return []


def bad_value_metric(bad: BadValues) -> Metric:
    counter = CounterMetricFamily(
        f"{NS}_exporter_bad_values",
        "Values skipped because their Redis key did not hold what it should (per key).",
        labels=["key"],
    )
    for key, count in sorted(bad.counts.items()):
        counter.add_metric([key], count)
    return counter


def gauges(readings: list[Reading], bad: BadValues) -> Iterator[Metric]:
    queue = GaugeMetricFamily(f"{NS}_queue_length", "Requests queued.", labels=["spider"])
    flight = GaugeMetricFamily(f"{NS}_in_flight", "Requests leased by a worker.", labels=["spider"])
    dedup = GaugeMetricFamily(
        f"{NS}_dedup_fingerprints", "Fingerprints in the dedup filter.", labels=["spider"]
    )
    age = GaugeMetricFamily(
        f"{NS}_last_response_age_seconds",
        "Seconds since a page was last fetched.",
        labels=["spider"],
    )
    now = time.time()
    for r in readings:
        name = [r.keys.spider]
        for family, value in ((queue, r.queued), (flight, r.in_flight), (dedup, r.fingerprints)):
            if value is not None:
                family.add_metric(name, value)
        last = last_response(r, bad)
        if last is not None:
            age.add_metric(name, max(now - last, 0.0))
    yield from (queue, flight, dedup, age)


def last_response(reading: Reading, bad: BadValues) -> float | None:
    """When the spider last fetched a page; None if never, or if the field is not a time."""
    if LAST_RESPONSE not in reading.stats:
        return None
    value = reading.stats[LAST_RESPONSE]
    try:
        return float(value)
    except ValueError:
        bad.note(reading.keys.stats, f"field {LAST_RESPONSE!r}: {quote(value)} is not a time")
        return None


def counters(readings: list[Reading]) -> Iterator[Metric]:
    plain = {
        field: CounterMetricFamily(f"{NS}_{name}", text, labels=["spider"])
        for field, (name, text) in COUNTERS.items()
    }
    labelled: dict[str, CounterMetricFamily] = {}
    for name, label, text in LABELLED.values():
        family = CounterMetricFamily(f"{NS}_{name}", text, labels=["spider", label])
        labelled.setdefault(name, family)
    for r in readings:
        for field, family in plain.items():
            family.add_metric([r.keys.spider], number(r.stats.get(field, "0")))
        for field, value in r.stats.items():
            for prefix, (name, _, _) in LABELLED.items():
                if field.startswith(prefix):
                    labelled[name].add_metric([r.keys.spider, field[len(prefix) :]], number(value))
    yield from plain.values()
    yield from labelled.values()


def job_metrics(readings: list[Reading]) -> Iterator[Metric]:
    jobs = GaugeMetricFamily(f"{NS}_jobs", "Jobs queued or running.", labels=["spider", "state"])
    finished = CounterMetricFamily(
        f"{NS}_jobs_finished", "Jobs finished, by final state.", labels=["spider", "state"]
    )
    for r in readings:
        if r.jobs is None:
            continue
        for family, states in ((jobs, JOB_GAUGES), (finished, JOB_COUNTERS)):
            for state in states:
                value = r.jobs.get(state, 0)
                if value is not None:  # None: not a number in Redis (noted), skipped
                    family.add_metric([r.keys.spider, state], value)
    yield from (jobs, finished)


SITE_GAUGES = {
    "in_flight": ("site_in_flight", "Requests of the site leased now, across all workers."),
    "paused_for": ("site_pause_remaining_seconds", "Seconds the site stays paused by a back-off."),
    "delay": (
        "site_delay_seconds",
        "Seconds between the site's leases: a slowdown's or AutoThrottle's (0: none).",
    ),
}
SITE_COUNTERS = {
    "leased": ("site_leased", "Requests of the site leased (their rate is the site's rate)."),
    "parked": ("site_parked", "Requests that waited for the site's limits before a lease."),
    "backoffs": ("site_backoffs", "Back-offs (a 429, or a 5xx with Retry-After) from the site."),
    "slowdowns": ("site_slowdowns", "Times the site's server errors, a large share, slowed it."),
    "paused_total": ("site_paused_seconds", "Seconds the site was paused by back-offs."),
}


def site_metrics(groups: dict[str, list[SiteReading]]) -> Iterator[Metric]:
    """Per site of each spider group: in flight, pause, rate, waits and back-offs."""
    labels = ["group", "site"]
    now = {f: GaugeMetricFamily(f"{NS}_{n}", t, labels=labels) for f, (n, t) in SITE_GAUGES.items()}
    total = {
        f: CounterMetricFamily(f"{NS}_{n}", t, labels=labels) for f, (n, t) in SITE_COUNTERS.items()
    }
    for group, sites in groups.items():
        for reading in sites:
            for field, gauge in now.items():
                gauge.add_metric([group, reading.site], getattr(reading, field))
            for field, counter in total.items():
                counter.add_metric([group, reading.site], getattr(reading, field))
    yield from now.values()
    yield from total.values()


def worker_metrics(workers: list[WorkerInfo], spiders: Sequence[SpiderKeys]) -> Iterator[Metric]:
    """Per registered worker process, the age of its last heartbeat; per spider, live hosts."""
    age = GaugeMetricFamily(
        f"{NS}_worker_heartbeat_age_seconds",
        "Seconds since a worker process's last heartbeat (lost ones stay listed for an hour).",
        labels=["worker", "spiders"],
    )
    for worker in workers:
        age.add_metric([worker.id, ",".join(worker.spiders)], worker.age)
    live = GaugeMetricFamily(
        f"{NS}_live_workers", "Live worker processes that host the spider.", labels=["spider"]
    )
    for keys in spiders:
        live.add_metric([keys.spider], len(hosts(workers, keys.spider)))
    yield from (age, live)


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def serve(
    client: redis.Redis,
    spiders: Sequence[SpiderKeys],
    port: int,
    addr: str,
    workers: Registry | None = None,
) -> Any:
    """Serve ``/metrics`` in a background thread; returns (server, thread).

    The server's threads, connections and time are bounded
    (:mod:`celery_crawl.tools.http_server`): idle or slow clients cannot exhaust it.
    """
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(CrawlCollector(client, spiders, workers))

    def page() -> Answer:
        try:
            return 200, CONTENT_TYPE_LATEST, generate_latest(registry)
        except Exception as exc:  # Redis away, or a bug: this scrape fails, the server stays
            logger.warning("scrape failed: %r", exc, exc_info=True)
            return 500, "text/plain", f"scrape failed: {type(exc).__name__}\n".encode()

    server = BoundedHTTPServer(addr, port, page).start()
    return server, server.thread
