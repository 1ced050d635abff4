"""Recovery: the end-to-end forum crawl with a worker killed (``kill -9``) halfway, and restarted.

Two ``celery -A benchmarks.bench_app worker --pool solo`` processes crawl the
demo forum, one job per forum, as ``benchmarks.e2e`` does. Rounds alternate:

- undisturbed: the crawl as it is;
- killed: once the site has served ``--kill-at`` of the pages, worker 0's
  process group gets SIGKILL and a new worker 0 is started at once, as a
  supervisor would. The requests the dead process held come back when their
  leases expire (``SCHEDULER_LEASE_SECONDS``), at the next heartbeat of a
  live process.

Reported per kind of round: the median time from the first request to the
last job done, and for the killed rounds the median time from the kill to
the last job done, and the pages the site served twice.

    python -m benchmarks.recovery [--rounds 3] [--forums 8] [--kill-at 0.5]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass

import redis

from benchmarks.common import median, redis_url, table
from benchmarks.e2e import Feeds, Processes, env_for, wait_for
from celery_crawl.demo.site import SiteConfig, SiteThread, run_in_thread

WORKERS = 2


@dataclass(frozen=True)
class Round:
    seconds: float  # first request to the last job done
    after_kill: float | None  # kill to the last job done
    served_twice: int


def worker_command(number: int, generation: int) -> list[str]:
    return [
        sys.executable,
        *("-m", "celery", "-A", "benchmarks.bench_app", "worker", "--pool", "solo"),
        *("--hostname", f"bench{number}-{generation}@%h", "--without-gossip", "--without-mingle"),
        *("--loglevel", "INFO"),
    ]


def run(url: str, config: SiteConfig, kill_at: float | None) -> Round:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    procs = Processes()
    with run_in_thread(config) as site:
        env = env_for(url, prefix, site.url, Feeds("recovery"))
        os.environ.update(
            {k: env[k] for k in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL")}
        )
        from celery_crawl import crawl, create_app

        app = create_app("bench_app", "benchmarks.bench_settings")
        for number in range(WORKERS):
            procs.start(worker_command(number, 0), env, f"recovery-{number}")
        try:
            procs.wait_logged("hosting crawlers")
            jobs = [crawl("forum", [{"forum_id": f}], app=app) for f in config.forum_ids()]
            expected = config.expected()
            total = expected.pages + expected.not_found
            killed = kill_and_restart(site, procs, env, int(total * kill_at)) if kill_at else None
            for job in jobs:
                result = job.wait(timeout=600)
                assert result["state"] == "done", result
            done = time.monotonic()
            first = site.site.first_request_time or done
            served_twice = site.site.requests_served - len(site.site.requests_by_path)
            return Round(done - first, None if killed is None else done - killed, served_twice)
        finally:
            procs.stop()


def kill_and_restart(site: SiteThread, procs: Processes, env: dict[str, str], pages: int) -> float:
    """SIGKILL worker 0 once ``pages`` were served, start a new one; returns the kill time."""
    wait_for(lambda: site.site.requests_served >= pages, 300, f"{pages} pages")
    victim, _ = procs.procs[0]
    os.killpg(victim.pid, signal.SIGKILL)
    killed = time.monotonic()
    victim.wait(10)
    procs.start(worker_command(0, 1), env, "recovery-0-restarted")
    return killed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forums", type=int, default=8)
    parser.add_argument("--kill-at", type=float, default=0.5, help="share of pages before kill")
    parser.add_argument("--redis-url")
    args = parser.parse_args(argv)
    config = SiteConfig(forums=args.forums, posts_per_forum=100)
    undisturbed: list[Round] = []
    killed: list[Round] = []
    with redis_url(args.redis_url) as url:
        for number in range(args.rounds):
            for kind, kill_at, found in (
                ("undisturbed", None, undisturbed),
                ("killed", args.kill_at, killed),
            ):
                redis.Redis.from_url(url).flushdb()
                found.append(run(url, config, kill_at))
                print(f"round {number + 1}, {kind}: {found[-1]}", flush=True)
    report(undisturbed, killed, args, config)


def report(
    undisturbed: list[Round], killed: list[Round], args: argparse.Namespace, config: SiteConfig
) -> None:
    expected = config.expected()
    print(
        f"\n{expected.pages + expected.not_found} pages; {WORKERS} worker processes (solo);"
        f" worker 0 killed after {args.kill_at:.0%} of the pages and restarted;"
        f" median of {args.rounds} rounds\n"
    )
    rows = [
        ["undisturbed", f"{median([r.seconds for r in undisturbed]):.1f} s", "", "0"],
        [
            "kill -9 halfway",
            f"{median([r.seconds for r in killed]):.1f} s",
            f"{median([r.after_kill or 0.0 for r in killed]):.1f} s",
            f"{median([float(r.served_twice) for r in killed]):.0f}",
        ],
    ]
    headers = ["crawl", "first request to done", "kill to done", "pages fetched twice"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
