"""What idle hosted spiders cost: one worker process hosting N spiders, none with work.

For each N, a celery_crawl worker (``--pool solo``) hosts the forum app's two
spiders and N - 2 idle copies (``BENCH_HOSTED_SPIDERS``,
benchmarks/many_spiders.py), with the default lease and heartbeat times. Once
its crawlers are open, the benchmark waits a few seconds, then measures over
``--seconds``: the threads of the worker process (``/proc/PID/task``), its
CPU time, and the Redis server's commands (scripts' inner commands included)
and script calls (round trips that run a script) per second.

The anchor: one ``scrapy crawl``-style process of scrapy-redis 0.9.1 hosting N
idle RedisSpiders (copies of the forum spider, each polling its own start
key), on the same Redis, in the same run.

    python -m benchmarks.idle [--spiders 2 10 40] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from benchmarks.common import redis_url, table
from benchmarks.e2e import LOGS, Processes, env_for

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_SECONDS = 5.0


@dataclass(frozen=True)
class Idle:
    threads: int
    cpu_percent: float
    commands_per_s: float
    scripts_per_s: float


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def server_counts(client: redis.Redis) -> tuple[int, int]:
    """Commands processed, and script calls, so far."""
    total = int(client.info("stats")["total_commands_processed"])
    stats = client.info("commandstats")
    scripts = sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPTS)
    return total, scripts


SCRIPTS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall")


def measure(procs: Processes, client: redis.Redis, seconds: float) -> Idle:
    """Settle, then measure the one process of ``procs`` and the server over ``seconds``."""
    time.sleep(SETTLE_SECONDS)
    proc = procs.procs[0][0]
    cpu_before, (commands_before, scripts_before) = process_cpu(proc.pid), server_counts(client)
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    commands, scripts = server_counts(client)
    threads = len(list(Path(f"/proc/{proc.pid}/task").iterdir()))
    return Idle(
        threads,
        100 * (process_cpu(proc.pid) - cpu_before) / elapsed,
        (commands - commands_before) / elapsed,
        (scripts - scripts_before) / elapsed,
    )


def run_celery_crawl(url: str, spiders: int, seconds: float) -> Idle:
    env = env_for(url, f"idle-{uuid.uuid4().hex[:8]}", "http://127.0.0.1:9")
    env["BENCH_HOSTED_SPIDERS"] = str(spiders)
    procs = Processes()
    command = [sys.executable, "-m", "celery", "-A", "benchmarks.bench_app", "worker"]
    command += ["--pool", "solo", "--without-gossip", "--without-mingle", "--loglevel", "INFO"]
    procs.start(command, env, f"idle-celery_crawl-{spiders}")
    try:
        procs.wait_logged("hosting crawlers", timeout=180)
        return measure(procs, redis.Redis.from_url(url), seconds)
    finally:
        procs.stop()


def run_scrapy_redis(url: str, spiders: int, seconds: float) -> Idle:
    procs = Processes()
    prefix = f"idle-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "benchmarks.e2e_spiders", "redis-idle", "http://127.0.0.1:9"]
    command += ["redis", url, prefix, str(spiders)]
    procs.start(command, env_for(url, prefix, "http://127.0.0.1:9"), f"idle-scrapy-redis-{spiders}")
    try:
        procs.wait_logged("Spider opened", timeout=180)
        return measure(procs, redis.Redis.from_url(url), seconds)
    finally:
        procs.stop()


SYSTEMS = (("celery_crawl", run_celery_crawl), ("scrapy-redis", run_scrapy_redis))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spiders", type=int, nargs="+", default=[2, 10, 40])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--redis-url")
    args = parser.parse_args(argv)
    LOGS.mkdir(parents=True, exist_ok=True)
    rows = []
    with redis_url(args.redis_url) as url:
        for spiders in args.spiders:
            for system, run in (
                ("celery_crawl", run_celery_crawl),
                ("scrapy-redis", run_scrapy_redis),
            ):
                idle = run(url, spiders, args.seconds)
                rows.append(
                    [
                        spiders,
                        system,
                        idle.threads,
                        f"{idle.cpu_percent:.1f}%",
                        f"{idle.commands_per_s:,.0f}",
                        f"{idle.scripts_per_s:,.1f}",
                    ]
                )
                print(f"{spiders} spiders, {system}: {idle}", flush=True)
    print(f"\nidle for {args.seconds:.0f} s after {SETTLE_SECONDS:.0f} s to settle\n")
    headers = ["spiders hosted", "system", "threads", "process CPU"]
    headers += ["Redis commands/s", "Redis script calls/s"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
