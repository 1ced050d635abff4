"""End to end: crawl the demo forum with three systems at the same concurrency.

- celery_crawl: ``celery -A benchmarks.bench_app worker --pool solo`` processes,
  one job per forum;
- scrapy-redis 0.9.1: ``scrapy crawl``-style processes of a RedisSpider, the
  forum ids pushed to its start key;
- plain Scrapy: the same spider with its in-memory scheduler, no Redis; with
  several processes, each crawls its share of the forums. This is the ceiling.

Every system stores its items: celery_crawl and plain Scrapy write JSON-lines
feeds, one file per process. scrapy-redis, by default, pushes them to Redis with
its RedisPipeline, as its example project does. With ``--anchor-items feed``,
it writes feeds too.

Pages/s is counted at the site, from its first request to its last. Pickup
latency is from submitting a job to an idle system until the site sees its
first request. For the two Redis systems, the Redis server's own CPU time and
command count over the crawl (``INFO``) are reported per 1,000 pages: the
cost that sizes a shard.

    python -m benchmarks.e2e [--processes 1 2] [--rounds 3] [--forums 8]
                             [--anchor-items redis|feed]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from benchmarks.common import median, redis_url, table
from celery_crawl.demo_site import SiteConfig, SiteThread, run_in_thread

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("celery_crawl", "scrapy-redis", "plain Scrapy")
LOGS = Path(os.environ.get("BENCH_LOGS", "/tmp")) / "celery_crawl-e2e"


@dataclass
class Run:
    pages_per_s: float
    pickup_ms: list[float] = field(default_factory=list)
    server: ServerCost | None = None


@dataclass(frozen=True)
class ServerCost:
    """The Redis server's CPU seconds and commands, from INFO."""

    cpu_s: float
    commands: int

    @classmethod
    def read(cls, client: redis.Redis) -> ServerCost:
        info: dict[str, Any] = client.info()  # type: ignore[assignment]
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return cls(cpu, int(info["total_commands_processed"]))

    def since(self, before: ServerCost, pages: int) -> ServerCost:
        """Per 1,000 pages: CPU milliseconds and commands."""
        per = 1000 / pages
        return ServerCost(
            (self.cpu_s - before.cpu_s) * 1000 * per, round((self.commands - before.commands) * per)
        )


def items_written(name: str) -> int:
    """Lines in the feed files of one system's processes (read after they stopped)."""
    files = (LOGS / "items").glob(f"{name}-*.jsonl")
    return sum(len(path.read_bytes().splitlines()) for path in files)


def check_items(name: str, expected: int) -> None:
    """Every system must really store its items, or the comparison is not fair."""
    written = items_written(name)
    if written < expected:
        raise RuntimeError(f"{name} wrote {written} items, expected at least {expected}")


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Processes:
    """Crawler processes of one system, each with its own log."""

    def __init__(self) -> None:
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, command: list[str], env: dict[str, str], name: str) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        log = LOGS / f"{name}.log"
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((proc, log))

    def wait_logged(self, text: str, timeout: float = 60) -> None:
        def logged() -> bool:
            for proc, log in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{log} exited:\n{log.read_text()[-2000:]}")
            return all(text in log.read_text() for _, log in self.procs)

        wait_for(logged, timeout, text)

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def throughput(site: SiteThread, total: int, timeout: float = 300) -> float:
    wait_for(lambda: site.site.requests_served >= total, timeout, "the crawl to finish")
    first = site.site.first_request_time or 0.0
    last = max(site.site.last_request_at.values())
    return site.site.requests_served / (last - first)


def pickup(site: SiteThread, submit: Callable[[], None], samples: int) -> list[float]:
    path = "/list/00001/1"
    latencies = []
    for _ in range(samples):
        time.sleep(0.5)  # idle again
        started = time.monotonic()
        submit()
        wait_for(lambda since=started: site.site.last_request_at.get(path, 0) > since, 30, "pickup")
        latencies.append((site.site.last_request_at[path] - started) * 1000)
    return latencies


def feed(name: str) -> str:
    """A feed path of its own for each process of each run."""
    return str(LOGS / "items" / f"{name}-%(pid)s-{uuid.uuid4().hex[:6]}.jsonl")


def env_for(url: str, prefix: str, site: str) -> dict[str, str]:
    return {
        **os.environ,
        "REDIS_URL": url,
        "CELERY_CRAWL_KEY_PREFIX": prefix,
        "FORUM_BASE_URL": site,
        "FORUM_FEED": feed("celery_crawl"),
        "PYTHONPATH": str(ROOT),
    }


def run_celery_crawl(url: str, config: SiteConfig, processes: int, samples: int) -> Run:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    procs = Processes()
    with run_in_thread(config) as site:
        env = env_for(url, prefix, site.url)
        os.environ.update(
            {k: env[k] for k in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL")}
        )
        from celery_crawl.celery_app import crawl, create_app

        app = create_app("bench_app", "benchmarks.bench_settings")
        for number in range(processes):
            command = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "benchmarks.bench_app",
                "worker",
                "--pool",
                "solo",
                "--hostname",
                f"bench{number}@%h",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "INFO",
            ]
            procs.start(command, env, f"celery_crawl-{number}")
        try:
            procs.wait_logged("hosting crawlers")
            client = redis.Redis.from_url(url)
            before = ServerCost.read(client)
            jobs = [crawl("forum", [{"forum_id": f}], app=app) for f in config.forum_ids()]
            expected = config.expected()
            rate = throughput(site, expected.pages + expected.not_found)
            for job in jobs:
                job.wait(timeout=60)
            cost = ServerCost.read(client).since(before, site.site.requests_served)
            submit = lambda: crawl("forum", [{"forum_id": "00001"}], app=app)  # noqa: E731
            return Run(rate, pickup(site, submit, samples), cost)
        finally:
            procs.stop()
            check_items("celery_crawl", config.expected().posts + config.expected().comments)


ANCHOR_ITEMS = {"sink": "redis"}


def run_scrapy_redis(url: str, config: SiteConfig, processes: int, samples: int) -> Run:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    procs = Processes()
    client = redis.Redis.from_url(url)
    with run_in_thread(config) as site:
        for number in range(processes):
            items = "redis" if ANCHOR_ITEMS["sink"] == "redis" else feed("scrapy-redis")
            command = [
                sys.executable,
                "-m",
                "benchmarks.e2e_spiders",
                "redis",
                site.url,
                items,
                url,
                prefix,
            ]
            procs.start(command, env_for(url, prefix, site.url), f"scrapy-redis-{number}")
        try:
            procs.wait_logged("Spider opened")
            key = f"{prefix}:forum:start_urls"
            before = ServerCost.read(client)
            client.lpush(key, *config.forum_ids())
            expected = config.expected()
            rate = throughput(site, expected.pages + expected.not_found)
            cost = ServerCost.read(client).since(before, site.site.requests_served)
            return Run(rate, pickup(site, lambda: client.lpush(key, "00001"), samples), cost)
        finally:
            procs.stop()
            if ANCHOR_ITEMS["sink"] == "feed":
                check_items("scrapy-redis", config.expected().posts + config.expected().comments)


def run_plain(url: str, config: SiteConfig, processes: int, samples: int) -> Run:
    procs = Processes()
    forums = config.forum_ids()
    with run_in_thread(config) as site:
        for number in range(processes):
            share = forums[number::processes]
            command = [
                sys.executable,
                "-m",
                "benchmarks.e2e_spiders",
                "plain",
                site.url,
                feed("plain"),
                *share,
            ]
            procs.start(command, env_for(url, "", site.url), f"plain-{number}")
        expected = config.expected()
        try:
            return Run(throughput(site, expected.pages + expected.not_found))
        finally:
            procs.stop()
            check_items("plain", config.expected().posts + config.expected().comments)


RUNNERS = {
    "celery_crawl": run_celery_crawl,
    "scrapy-redis": run_scrapy_redis,
    "plain Scrapy": run_plain,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forums", type=int, default=8)
    parser.add_argument("--pickup-samples", type=int, default=10)
    parser.add_argument("--redis-url")
    parser.add_argument("--anchor-items", choices=["redis", "feed"], default="redis")
    parser.add_argument("--comments-per-page", type=int, default=20, help="items per comment page")
    args = parser.parse_args(argv)
    ANCHOR_ITEMS["sink"] = args.anchor_items
    config = SiteConfig(
        forums=args.forums, posts_per_forum=100, comments_per_page=args.comments_per_page
    )
    results: dict[tuple[int, str], list[Run]] = {}
    with redis_url(args.redis_url) as url:
        for processes in args.processes:
            for round_no in range(args.rounds):
                for system in SYSTEMS:  # take turns, so drift hits all alike
                    redis.Redis.from_url(url).flushdb()
                    run = RUNNERS[system](url, config, processes, args.pickup_samples)
                    results.setdefault((processes, system), []).append(run)
                    print(
                        f"{processes} proc, round {round_no + 1}, {system}: "
                        f"{run.pages_per_s:,.0f} pages/s",
                        flush=True,
                    )
    report(results, args, config)


def report(results: dict[tuple[int, str], list[Run]], args: Any, config: SiteConfig) -> None:
    rows = []
    for processes in args.processes:
        ours = results[(processes, "celery_crawl")]
        for system in SYSTEMS:
            runs = results[(processes, system)]
            rate = median([r.pages_per_s for r in runs])
            vs_redis = median(
                [
                    o.pages_per_s / r.pages_per_s
                    for o, r in zip(ours, results[(processes, "scrapy-redis")], strict=True)
                ]
            )
            vs_plain = median(
                [
                    o.pages_per_s / r.pages_per_s
                    for o, r in zip(ours, results[(processes, "plain Scrapy")], strict=True)
                ]
            )
            samples = [ms for r in runs for ms in r.pickup_ms]
            pick = f"{statistics.median(samples):.0f} ms" if samples else "n/a"
            ratios = (f"{vs_redis:.2f}× / {vs_plain:.2f}×") if system == "celery_crawl" else ""
            rows.append([processes, system, f"{rate:,.0f}", ratios, pick, *server_cost(runs)])
    expected = config.expected()
    print(
        f"\n{expected.pages + expected.not_found} pages, {expected.posts + expected.comments}"
        f" items per crawl; concurrency 32 per process; median of {args.rounds} rounds\n"
    )
    print(
        table(
            [
                "processes",
                "system",
                "pages/s",
                "celery_crawl vs scrapy-redis / plain",
                "pickup (median)",
                "Redis CPU ms / 1k pages",
                "Redis commands / 1k pages",
            ],
            rows,
        )
    )


def server_cost(runs: list[Run]) -> list[str]:
    """Median Redis CPU and commands per 1,000 pages; n/a for plain Scrapy."""
    costs = [r.server for r in runs if r.server is not None]
    if not costs:
        return ["n/a", "n/a"]
    return [
        f"{median([c.cpu_s for c in costs]):.0f}",
        f"{median([c.commands for c in costs]):,.0f}",
    ]


if __name__ == "__main__":
    main()
