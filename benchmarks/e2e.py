"""End to end: crawl the demo forum with three systems at the same concurrency.

- celery_crawl: ``celery -A benchmarks.bench_app worker --pool solo`` processes,
  one job per forum;
- scrapy-redis 0.9.1: ``scrapy crawl``-style processes of a RedisSpider, the
  forum ids pushed to its start key;
- plain Scrapy: the same spider with its in-memory scheduler, no Redis; with
  several processes, each crawls its share of the forums. This is the ceiling.
- plain Scrapy, GC frozen: the same, with the startup heap frozen out of the
  garbage collector once the spider is open and the collector's thresholds
  raised, as a celery_crawl worker does (``CELERY_CRAWL_GC_FREEZE``,
  ``CELERY_CRAWL_GC_THRESHOLD``): the ceiling with the same memory tuning.

The site behaves like a real one by default: 2% of its answers are a 503
(a retry of the same page may succeed) and 1% of its pages are cut in half,
which the forum spider retries (``--error-rate``, ``--malformed-rate``). A
crawl is over when every page has had a good answer; pages/s is those pages
over the time from the first request to the last.

A celery_crawl worker hosts the forum app's two spiders; the system
"celery_crawl, 40 spiders hosted" adds 38 idle ones to each worker
(``BENCH_HOSTED_SPIDERS``, benchmarks/many_spiders.py), as in a project of
real size.

Every system stores its items: celery_crawl and plain Scrapy write JSON-lines
feeds, one file per process. scrapy-redis, by default, pushes them to Redis with
its RedisPipeline, as its example project does. With ``--anchor-items feed``,
it writes feeds too.

Pages/s is counted at the site, from its first request to its last. Pickup
latency is from submitting a job to an idle system until the site sees its
first request. The crawler processes' own CPU time over the same span
(``/proc/PID/stat``) is reported per page: what the code costs, apart from
time spent waiting. For the two Redis systems, the Redis server's own CPU
time and command count over the crawl (``INFO``) are reported per 1,000
pages: the cost that sizes a shard.

``--busy-neighbours N`` runs N busy-loop processes beside the crawl, as a
loaded machine would: it shows which ratios depend on the machine's state.

    python -m benchmarks.e2e [--processes 1 2] [--rounds 5] [--forums 8]
                             [--error-rate 0.02] [--malformed-rate 0.01]
                             [--anchor-items redis|feed] [--busy-neighbours N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import redis

from benchmarks.common import median, redis_url, table
from celery_crawl.demo.site import SiteConfig, SiteThread, run_in_thread

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = (
    "celery_crawl",
    "celery_crawl, 40 spiders hosted",
    "celery_crawl, no site limits",
    "scrapy-redis",
    "plain Scrapy",
    "plain Scrapy, GC frozen",
)
LOGS = Path(os.environ.get("BENCH_LOGS", "/tmp")) / "celery_crawl-e2e"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    pages_per_s: float
    cpu_ms_per_page: float | None
    pickup_ms: list[float] = field(default_factory=list)
    server: ServerCost | None = None


@dataclass(frozen=True)
class Crawl:
    """What the site saw of one crawl, and what it cost the crawler processes."""

    pages_per_s: float
    cpu_ms_per_page: float | None


@dataclass(frozen=True)
class ServerCost:
    """The Redis server's CPU seconds and commands, from INFO."""

    cpu_s: float
    commands: int

    @classmethod
    def read(cls, client: redis.Redis) -> ServerCost:
        info: dict[str, Any] = client.info()
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return cls(cpu, int(info["total_commands_processed"]))

    def since(self, before: ServerCost, pages: int) -> ServerCost:
        """Per 1,000 pages: CPU milliseconds and commands."""
        per = 1000 / pages
        return ServerCost(
            (self.cpu_s - before.cpu_s) * 1000 * per, round((self.commands - before.commands) * per)
        )


class Feeds:
    """The item feeds of one run of one system: a directory of its own, one file per process."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.directory = LOGS / "items" / f"{name}-{uuid.uuid4().hex[:8]}"
        self.directory.mkdir(parents=True)

    def path(self) -> str:
        return str(self.directory / "%(pid)s.jsonl")

    def check(self, expected: int) -> None:
        """Every system must really store its items, or the comparison is not fair."""
        files = self.directory.glob("*.jsonl")  # read after the processes stopped
        written = sum(len(path.read_bytes().splitlines()) for path in files)
        if written < expected:
            raise RuntimeError(f"{self.name} wrote {written} items, expected at least {expected}")


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

    def cpu_seconds(self) -> float | None:
        """User plus system CPU time of the processes so far; None without ``/proc``."""
        total = 0.0
        for proc, _ in self.procs:
            try:
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                return None
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
        return total

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


GIVE_UP_SECONDS = 3.0  # a site quiet this long: the crawl is over, even short of a page or two
GIVEN_UP_PAGES = 3  # pages a crawl may have given up after their retries (all faults)


def crawl(site: SiteThread, total: int, procs: Processes, timeout: float = 300) -> Crawl:
    """Wait until ``total`` pages had a good answer; pages/s and crawler CPU per page,
    from the first request on."""
    wait_for(lambda: site.site.first_request_time is not None, timeout, "the first request")
    cpu_before = procs.cpu_seconds()
    wait_for(lambda: crawled(site, total), timeout, "the crawl to finish")
    cpu_after = procs.cpu_seconds()
    first = site.site.first_request_time or 0.0
    last = max(site.site.last_request_at.values())
    pages = len(site.site.answered_paths)
    cpu = None
    if cpu_before is not None and cpu_after is not None:
        cpu = (cpu_after - cpu_before) * 1000 / pages
    return Crawl(pages / (last - first), cpu)


def crawled(site: SiteThread, total: int) -> bool:
    """Every page answered for good; or all but a few, given up, and the site quiet since."""
    answered = len(site.site.answered_paths)
    if answered >= total:
        return True
    quiet = time.monotonic() - max(site.site.last_request_at.values()) > GIVE_UP_SECONDS
    return quiet and answered >= total - GIVEN_UP_PAGES


def pickup(site: SiteThread, submit: Callable[[], object], samples: int) -> list[float]:
    path = "/list/00001/1"
    latencies = []
    for _ in range(samples):
        time.sleep(0.5)  # idle again
        started = time.monotonic()
        submit()

        def arrived(since: float = started) -> bool:
            return site.site.last_request_at.get(path, 0) > since

        wait_for(arrived, 30, "pickup")
        latencies.append((site.site.last_request_at[path] - started) * 1000)
    return latencies


def env_for(url: str, prefix: str, site: str, feeds: Feeds | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "REDIS_URL": url,
        "CELERY_CRAWL_KEY_PREFIX": prefix,
        "FORUM_BASE_URL": site,
        "PYTHONPATH": str(ROOT),
    }
    if feeds is not None:
        env["FORUM_FEED"] = feeds.path()
    return env


def run_celery_crawl(
    url: str,
    config: SiteConfig,
    processes: int,
    samples: int,
    *,
    site_limits: bool = True,
    hosted: int = 2,
) -> Run:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    procs = Processes()
    feeds = Feeds("celery_crawl")
    with run_in_thread(config) as site:
        env = env_for(url, prefix, site.url, feeds)
        env["SITE_LIMITS_ENABLED"] = str(site_limits).lower()
        env["BENCH_HOSTED_SPIDERS"] = str(hosted)
        os.environ.update(
            {k: env[k] for k in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL")}
        )
        from celery_crawl import crawl as start
        from celery_crawl import create_app

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
            jobs = [start("forum", [{"forum_id": f}], app=app) for f in config.forum_ids()]
            expected = config.expected()
            done = crawl(site, expected.pages + expected.not_found, procs)
            for job in jobs:
                job.wait(timeout=60)
            cost = ServerCost.read(client).since(before, site.site.requests_served)
            submit = lambda: start("forum", [{"forum_id": "00001"}], app=app)  # noqa: E731
            return Run(done.pages_per_s, done.cpu_ms_per_page, pickup(site, submit, samples), cost)
        finally:
            procs.stop()
            feeds.check(config.expected().posts + config.expected().comments)


ANCHOR_ITEMS = {"sink": "redis"}


def run_scrapy_redis(url: str, config: SiteConfig, processes: int, samples: int) -> Run:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    procs = Processes()
    client = redis.Redis.from_url(url)
    feeds = Feeds("scrapy-redis")
    with run_in_thread(config) as site:
        for number in range(processes):
            items = "redis" if ANCHOR_ITEMS["sink"] == "redis" else feeds.path()
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
            done = crawl(site, expected.pages + expected.not_found, procs)
            cost = ServerCost.read(client).since(before, site.site.requests_served)
            pickups = pickup(site, lambda: client.lpush(key, "00001"), samples)
            return Run(done.pages_per_s, done.cpu_ms_per_page, pickups, cost)
        finally:
            procs.stop()
            if ANCHOR_ITEMS["sink"] == "feed":
                feeds.check(config.expected().posts + config.expected().comments)


def run_plain(
    url: str, config: SiteConfig, processes: int, samples: int, mode: str = "plain"
) -> Run:
    procs = Processes()
    forums = config.forum_ids()
    feeds = Feeds(mode)
    with run_in_thread(config) as site:
        for number in range(processes):
            share = forums[number::processes]
            command = [
                sys.executable,
                "-m",
                "benchmarks.e2e_spiders",
                mode,
                site.url,
                feeds.path(),
                *share,
            ]
            procs.start(command, env_for(url, "", site.url), f"{mode}-{number}")
        expected = config.expected()
        try:
            done = crawl(site, expected.pages + expected.not_found, procs)
            return Run(done.pages_per_s, done.cpu_ms_per_page)
        finally:
            procs.stop()
            feeds.check(config.expected().posts + config.expected().comments)


RUNNERS: dict[str, Callable[[str, SiteConfig, int, int], Run]] = {
    "celery_crawl": run_celery_crawl,
    "celery_crawl, 40 spiders hosted": partial(run_celery_crawl, hosted=40),
    "celery_crawl, no site limits": partial(run_celery_crawl, site_limits=False),
    "scrapy-redis": run_scrapy_redis,
    "plain Scrapy": run_plain,
    "plain Scrapy, GC frozen": partial(run_plain, mode="plain-frozen"),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--forums", type=int, default=8)
    parser.add_argument("--pickup-samples", type=int, default=10)
    parser.add_argument("--redis-url")
    parser.add_argument("--anchor-items", choices=["redis", "feed"], default="redis")
    parser.add_argument("--comments-per-page", type=int, default=20, help="items per comment page")
    parser.add_argument("--error-rate", type=float, default=0.02, help="answers that are a 503")
    parser.add_argument("--malformed-rate", type=float, default=0.01, help="pages cut in half")
    parser.add_argument(
        "--busy-neighbours", type=int, default=0, help="busy-loop processes beside the crawl"
    )
    args = parser.parse_args(argv)
    ANCHOR_ITEMS["sink"] = args.anchor_items
    config = SiteConfig(
        forums=args.forums,
        posts_per_forum=100,
        comments_per_page=args.comments_per_page,
        error_rate=args.error_rate,
        malformed_rate=args.malformed_rate,
    )
    results: dict[tuple[int, str], list[Run]] = {}
    with redis_url(args.redis_url) as url, busy_neighbours(args.busy_neighbours):
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


@contextlib.contextmanager
def busy_neighbours(count: int) -> Iterator[None]:
    """``count`` processes that spin on a core each, until the benchmark ends."""
    spin = [sys.executable, "-c", "while True: pass"]
    neighbours = [subprocess.Popen(spin) for _ in range(count)]
    try:
        yield
    finally:
        for proc in neighbours:
            proc.kill()
            proc.wait()


def ratios(
    results: dict[tuple[int, str], list[Run]],
    processes: int,
    other: str,
    system: str = "celery_crawl",
) -> list[float]:
    """``system``'s pages/s over ``other``'s, round by round."""
    ours, theirs = results[(processes, system)], results[(processes, other)]
    return [o.pages_per_s / t.pages_per_s for o, t in zip(ours, theirs, strict=True)]


def report(results: dict[tuple[int, str], list[Run]], args: Any, config: SiteConfig) -> None:
    rows = []
    for processes in args.processes:
        for system in SYSTEMS:
            runs = results[(processes, system)]
            rate = median([r.pages_per_s for r in runs])
            samples = [ms for r in runs for ms in r.pickup_ms]
            pick = f"{statistics.median(samples):.0f} ms" if samples else "n/a"
            ratio = (
                ""
                if system == "celery_crawl"
                else f"{median(ratios(results, processes, system)):.2f}×"
            )
            cpu = [r.cpu_ms_per_page for r in runs if r.cpu_ms_per_page is not None]
            cpu_text = f"{median(cpu):.2f}" if cpu else "n/a"
            rows.append(
                [processes, system, f"{rate:,.0f}", ratio, pick, cpu_text, *server_cost(runs)]
            )
    expected = config.expected()
    print(
        f"\n{expected.pages + expected.not_found} pages, {expected.posts + expected.comments}"
        f" items per crawl; {args.error_rate:.0%} of answers 503, {args.malformed_rate:.0%} of"
        f" pages cut; concurrency 32 per process; median of {args.rounds} rounds"
        f"{f'; {args.busy_neighbours} busy neighbours' if args.busy_neighbours else ''}\n"
    )
    print(
        table(
            [
                "processes",
                "system",
                "pages/s",
                "celery_crawl ÷ system",
                "pickup (median)",
                "crawler CPU ms / page",
                "Redis CPU ms / 1k pages",
                "Redis commands / 1k pages",
            ],
            rows,
        )
    )
    print()
    for processes in args.processes:
        for other in SYSTEMS[1:]:
            each = ", ".join(f"{r:.2f}×" for r in ratios(results, processes, other))
            print(f"{processes} proc, celery_crawl ÷ {other}, round by round: {each}")
    print()
    many = SYSTEMS[1]
    for processes in args.processes:
        for other in ("scrapy-redis", "plain Scrapy", "plain Scrapy, GC frozen"):
            each = ratios(results, processes, other, system=many)
            text = ", ".join(f"{r:.2f}×" for r in each)
            print(f"{processes} proc, {many} ÷ {other}: median {median(each):.2f}× ({text})")


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
