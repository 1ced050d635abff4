"""Exact, time-expiring and hit-expiring dedup on a rolling forum: memory, refetches, misses.

The demo site's forums grow while the benchmark runs (``--growth`` new posts per
minute each) and list only their newest ``--listed`` posts (a rolling listing: a
post scrolls off after ``listed / growth`` minutes, and no page links to it again).
Each forum is a source; ``--crawls`` times, ``--period`` seconds apart, one job per
forum crawls it (``crawl(..., source=forum)``) with a real worker (``celery -A
benchmarks.bench_app worker --pool solo``), under ``DUPEFILTER_SCOPE = "spider"``
(the forum spider's): each crawl fetches the listing again and the posts (and their
comment pages) its filter has not seen. One run per filter, each on a fresh site,
prefix and worker:

- **exact** (``RFPDupeFilter``): remembers every post for good;
- **time-expiring** (``ExpiringDupeFilter``) with a window of half a post's time on
  the listing, and of twice that time;
- **hit-expiring** (``HitExpiringDupeFilter``): forgets a post ``--keep-crawls``
  crawls after the last crawl that found it linked.

Reported, after the last crawl: the filter's fingerprints and its memory (``MEMORY
USAGE`` over its keys), pages fetched twice (post and comment pages fetched more than
once; list pages are fetched at every crawl by design), and new posts missed (posts a
crawl saw listed whose page was never fetched).

    python -m benchmarks.dedup_rolling [--crawls 20] [--forums 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import redis

from benchmarks.common import redis_url, table
from benchmarks.e2e import Processes, env_for
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.demo.site import SiteConfig, SiteThread, post_id, run_in_thread
from celery_crawl.dupefilter.filters import DUPEFILTER_CLASSES

FILTERS = "celery_crawl.dupefilter."


@dataclass(frozen=True)
class Filter:
    name: str
    path: str
    settings: dict[str, str]


@dataclass
class Result:
    filter: Filter
    fingerprints: int
    memory: int
    pages: int
    twice: int
    missed: int
    listed: int

    def row(self) -> list[object]:
        return [
            self.filter.name,
            self.fingerprints,
            f"{self.memory / 1024:.1f}",
            self.pages,
            self.twice,
            self.missed,
            self.listed,
        ]


def filters(args: argparse.Namespace) -> list[Filter]:
    on_listing = args.listed / args.growth * 60  # seconds a post stays listed
    short, long = on_listing / 2, on_listing * 2
    return [
        Filter("exact", FILTERS + "RFPDupeFilter", {}),
        Filter(
            f"time-expiring, {short:g} s",
            FILTERS + "ExpiringDupeFilter",
            {"DUPEFILTER_EXPIRE_SECONDS": str(short)},
        ),
        Filter(
            f"time-expiring, {long:g} s",
            FILTERS + "ExpiringDupeFilter",
            {"DUPEFILTER_EXPIRE_SECONDS": str(long)},
        ),
        Filter(
            f"hit-expiring, {args.keep_crawls} crawls",
            FILTERS + "HitExpiringDupeFilter",
            {"DUPEFILTER_EXPIRE_CRAWLS": str(args.keep_crawls)},
        ),
    ]


def crawl_all(app: object, forums: list[str], timeout: float) -> None:
    """One crawl of every forum: a job each, its source the forum; until all are done."""
    from celery_crawl import crawl

    jobs = [crawl("forum", [{"forum_id": f}], app=app, source=f) for f in forums]
    for job in jobs:
        result = job.wait(timeout=timeout)
        if result["state"] != "done":
            raise RuntimeError(f"job {job.id} ended {result['state']}: {result}")


def counts(config: SiteConfig, site: SiteThread) -> tuple[int, int, int, int]:
    """Pages fetched (not list pages), fetched twice, posts missed, posts a crawl saw listed."""
    fetched = Counter(
        a.path for a in site.arrivals() if a.status == 200 and not a.path.startswith("/list/")
    )
    listed: set[tuple[int, int]] = set()
    for arrival in site.arrivals():
        if arrival.path.startswith("/list/") and arrival.status == 200:
            index = int(arrival.path.split("/")[2])
            posts = config.posts_in(index, arrival.started)
            first = max(0, posts - config.listed)
            listed.update((index, ordinal) for ordinal in range(first, posts))
    shown = [p for p in listed if not config.is_deleted(p[1])]
    missed = sum(1 for index, ordinal in shown if f"/post/{post_id(index, ordinal)}" not in fetched)
    twice = sum(1 for n in fetched.values() if n > 1)
    return sum(fetched.values()), twice, missed, len(shown)


def run(url: str, base: SiteConfig, kind: Filter, args: argparse.Namespace) -> Result:
    prefix = f"dedup-{uuid.uuid4().hex[:8]}"
    config = dataclasses.replace(base, growth_from=time.time())
    procs = Processes()
    with run_in_thread(config) as site:
        env = {**env_for(url, prefix, site.url), "DUPEFILTER_CLASS": kind.path, **kind.settings}
        os.environ.update(
            {k: env[k] for k in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL")}
        )
        os.environ.update({"DUPEFILTER_CLASS": kind.path, **kind.settings})
        from celery_crawl import create_app

        app = create_app("bench_app", "benchmarks.bench_settings")
        command = [sys.executable, "-m", "celery", "-A", "benchmarks.bench_app", "worker"]
        command += ["--pool", "solo", "--without-gossip", "--without-mingle", "-l", "INFO"]
        procs.start(command, env, f"dedup-{kind.path.rsplit('.', 1)[1]}")
        try:
            procs.wait_logged("hosting crawlers")
            forums = config.forum_ids()
            for number in range(args.crawls):
                began = time.monotonic()
                crawl_all(app, forums, timeout=120)
                print(f"  {kind.name}: crawl {number + 1} of {args.crawls}", flush=True)
                time.sleep(max(0.0, args.period - (time.monotonic() - began)))
        finally:
            procs.stop()
            for name in ("DUPEFILTER_CLASS", *kind.settings):
                os.environ.pop(name, None)
        keys = SpiderKeys.build("forum", prefix=prefix)
        dedup = DUPEFILTER_CLASSES[kind.path](redis.Redis.from_url(url), keys, None)
        pages, twice, missed, listed = counts(config, site)
    return Result(kind, len(dedup), dedup.memory_usage(), pages, twice, missed, listed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--crawls", type=int, default=20)
    parser.add_argument("--period", type=float, default=4.0, help="seconds between crawls")
    parser.add_argument("--forums", type=int, default=10)
    parser.add_argument("--listed", type=int, default=30, help="posts a listing shows")
    parser.add_argument("--growth", type=float, default=60.0, help="new posts/min a forum")
    parser.add_argument("--keep-crawls", type=int, default=2, help="hit-expiring: N")
    args = parser.parse_args(argv)
    base = SiteConfig(
        forums=args.forums,
        posts_per_forum=args.listed,
        posts_per_page=args.listed,
        hot_every=0,
        growth=(args.growth,),
        listed=args.listed,
    )
    with redis_url() as url:
        results = [run(url, base, kind, args) for kind in filters(args)]
    headers = [
        "filter",
        "fingerprints at the end",
        "memory (KiB)",
        "pages fetched",
        "pages fetched twice",
        "new posts missed",
        "posts listed",
    ]
    print(table(headers, [result.row() for result in results]))
    print(
        f"\n{args.forums} forums listing their newest {args.listed} posts, growing"
        f" {args.growth:g} posts/min each; {args.crawls} crawls {args.period:g} s apart"
    )


if __name__ == "__main__":
    main()
