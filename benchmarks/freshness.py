"""Adaptive against fixed revisit intervals: how fresh a forum crawl stays, for the pages.

The demo site's forums grow while the benchmark runs, at very different rates
(``--growth``, new posts per minute, cycled over the forums: by default one forum
in six is busy, one steady, four quiet). Each forum is a source of the ``forum``
spider (docs/producer.md), and the producer ticks every second, as beat would,
with a real worker (``celery -A benchmarks.bench_app worker --pool solo``) crawling.
Two runs on the same site layout, each on a fresh site, prefix and worker:

- **adaptive**: every source starts at ``--interval`` and moves within
  [``--min-interval``, ``--max-interval``]: shorter after a job that found items,
  longer after one that found none (``PRODUCER_ADAPTIVE_FASTER`` / ``_SLOWER``);
- **fixed**: every source at one interval, chosen so that it runs as many jobs as
  the adaptive run did: the same pages fetched, spent evenly.

For each post that appeared during a run: its staleness, from its appearance to
the first fetch of its page (a post never fetched counts until the run's end,
and as missed). Reported: median and 90th percentile staleness, posts missed, pages
fetched in all and per new post, and jobs. The target is a median staleness at
least 2x lower with adaptive intervals, for about the same pages fetched.

    python -m benchmarks.freshness [--seconds 240] [--forums 30]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from benchmarks.common import redis_url, table
from benchmarks.e2e import Processes, env_for
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.demo.site import POST_ID_STRIDE, SiteConfig, SiteThread, post_id, run_in_thread
from celery_crawl.producer.schedule import Schedule, Source

PERIOD = 1.0  # seconds between producer ticks, as beat would send them


@dataclass
class Result:
    mode: str
    interval: str
    jobs: int
    pages: int
    new_posts: int
    missed: int
    staleness: list[float]

    def row(self) -> list[object]:
        p90 = statistics.quantiles(self.staleness, n=10)[-1] if len(self.staleness) > 1 else 0
        return [
            self.mode,
            self.interval,
            self.jobs,
            self.pages,
            self.new_posts,
            f"{self.pages / max(1, self.new_posts):.2f}",
            self.missed,
            f"{statistics.median(self.staleness):.1f}",
            f"{p90:.1f}",
        ]


def sources(config: SiteConfig, args: argparse.Namespace, fixed: float | None) -> list[Source]:
    """A source per forum: adaptive within the bounds, or every one at ``fixed``."""
    found = []
    for forum in config.forum_ids():
        seeds = [{"forum_id": forum}]
        if fixed is None:
            found.append(
                Source(
                    forum,
                    seeds,
                    args.interval,
                    adaptive=True,
                    min_interval=args.min_interval,
                    max_interval=args.max_interval,
                )
            )
        else:
            found.append(Source(forum, seeds, fixed))
    return found


def tick_every(app: Any, period: float, stop: threading.Event) -> None:
    """What beat does: the producer's task for the spider, every ``period`` seconds."""
    while not stop.wait(period):
        app.send_task("celery_crawl.produce", args=("forum",))


def staleness(config: SiteConfig, site: SiteThread, end: float) -> tuple[list[float], int, int]:
    """Per post that appeared before ``end``: seconds to its first fetch; and posts missed."""
    first: dict[str, float] = {}
    for arrival in site.arrivals():
        if arrival.path.startswith("/post/") and arrival.status == 200:
            first.setdefault(arrival.path[len("/post/") :], arrival.started)
    values, missed, appeared_count = [], 0, 0
    for index in range(1, config.forums + 1):
        for ordinal in range(config.posts_per_forum, config.posts_in(index, end)):
            appeared = config.appeared_at(index, ordinal)
            if appeared is None or appeared > end or config.is_deleted(ordinal):
                continue
            appeared_count += 1
            fetched = first.get(post_id(index, ordinal))
            if fetched is None:
                missed += 1
            values.append((fetched if fetched is not None else end) - appeared)
    return values, missed, appeared_count


def run(
    mode: str, url: str, base: SiteConfig, args: argparse.Namespace, fixed: float | None
) -> Result:
    prefix = f"fresh-{uuid.uuid4().hex[:8]}"
    config = dataclasses.replace(base, growth_from=time.time() + 5)  # growth after the start
    procs = Processes()
    with run_in_thread(config) as site:
        env = env_for(url, prefix, site.url)
        os.environ.update({k: env[k] for k in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX")})
        os.environ["FORUM_BASE_URL"] = site.url
        from celery_crawl import create_app

        app = create_app("bench_app", "benchmarks.bench_settings")
        command = [sys.executable, "-m", "celery", "-A", "benchmarks.bench_app", "worker"]
        command += ["--pool", "solo", "--without-gossip", "--without-mingle", "-l", "INFO"]
        procs.start(command, env, f"freshness-{mode}")
        client = redis.Redis.from_url(url)
        keys = SpiderKeys.build("forum", prefix=prefix)
        stop = threading.Event()
        ticker = threading.Thread(target=tick_every, args=(app, PERIOD, stop), daemon=True)
        try:
            procs.wait_logged("hosting crawlers")
            schedule = Schedule(client, keys)
            for source in sources(config, args, fixed):
                schedule.put(source)
            ticker.start()
            time.sleep(max(0.0, config.growth_from - time.time()) + args.seconds)
            end = time.time()
            stop.set()
            ticker.join(10)
            pages = site.requests_served
            jobs = int(client.hget(keys.stats, "producer/produced") or 0)
        finally:
            stop.set()
            procs.stop()
        values, missed, appeared = staleness(config, site, end)
    interval = (
        f"{fixed:.1f} s"
        if fixed is not None
        else f"{args.interval:g} s in [{args.min_interval:g}, {args.max_interval:g}]"
    )
    return Result(mode, interval, jobs, pages, appeared, missed, values or [math.nan])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=240.0, help="length of each run")
    parser.add_argument("--forums", type=int, default=30)
    parser.add_argument("--growth", default="10,2,0.2,0.2,0.2,0.2", help="posts/min, cycled")
    parser.add_argument("--interval", type=float, default=10.0, help="adaptive: the start")
    parser.add_argument("--min-interval", type=float, default=2.0)
    parser.add_argument("--max-interval", type=float, default=120.0)
    args = parser.parse_args(argv)
    growth = tuple(float(rate) for rate in args.growth.split(","))
    base = SiteConfig(
        forums=args.forums,
        posts_per_forum=10,
        posts_per_page=50,
        hot_every=0,
        growth=growth,
    )
    assert base.posts_per_forum + max(growth) * args.seconds / 60 < POST_ID_STRIDE
    with redis_url() as url:
        adaptive = run("adaptive", url, base, args, None)
        # the same jobs, spread evenly: the fixed interval that runs as many
        fixed_interval = args.forums * args.seconds / max(1, adaptive.jobs)
        fixed = run("fixed", url, base, args, fixed_interval)
    headers = [
        "intervals",
        "interval",
        "jobs",
        "pages fetched",
        "new posts",
        "pages per new post",
        "missed",
        "staleness median (s)",
        "p90 (s)",
    ]
    print(table(headers, [adaptive.row(), fixed.row()]))
    ratio = statistics.median(fixed.staleness) / statistics.median(adaptive.staleness)
    pages = adaptive.pages / max(1, fixed.pages)
    print(
        f"\nadaptive is {ratio:.2f}x fresher (median staleness, fixed / adaptive), for"
        f" {pages:.2f}x the pages; {args.forums} forums growing at {args.growth} posts/min,"
        f" {args.seconds:g} s each"
    )


if __name__ == "__main__":
    main()
