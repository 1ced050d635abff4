"""Scheduler throughput and memory: celery_crawl against scrapy-redis 0.9.1.

Workload (per round, per system, on the same Redis): N requests with
realistic forum meta, a quarter of them duplicates, enqueued through the
scheduler's ``enqueue_request``; then all popped through ``next_request``
(celery_crawl leases each one, its site counted, with no cap or rate: nothing is
acked). ``MEMORY USAGE`` of the dedup and queue keys is read between the two phases.

    python -m benchmarks.scheduler [--requests 20000] [--rounds 5] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import functools
import random
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from scrapy import Request, Spider
from scrapy.exceptions import ScrapyDeprecationWarning
from scrapy.utils.test import get_crawler

from benchmarks.common import median, redis_url, table


class ForumSpider(Spider):
    name = "forum"

    def parse_list(self, response: Any) -> None: ...

    def parse_post(self, response: Any) -> None: ...

    def parse_comments(self, response: Any) -> None: ...


def workload(total: int, dup_ratio: float, spider: Spider, seed: int = 7) -> list[Request]:
    """Forum requests of ``spider``: list pages, posts and comment pages, duplicates mixed in.

    Their callbacks are methods of that spider instance: the scheduler queues no other.
    """
    rng = random.Random(seed)
    job = uuid.UUID(int=rng.getrandbits(128)).hex
    unique = []
    for i in range(int(total * (1 - dup_ratio))):
        forum, post = f"{i % 50 + 1:05d}", str(100000 + i)
        kind = i % 10
        if kind == 0:
            url, cb, prio = (
                f"http://127.0.0.1:8000/list/{forum}/{i // 10 + 1}",
                spider.parse_list,
                20,
            )
        elif kind < 4:
            url, cb, prio = f"http://127.0.0.1:8000/post/{post}", spider.parse_post, 10
        else:
            url, cb, prio = f"http://127.0.0.1:8000/comment/{post}/{kind}", spider.parse_comments, 0
        meta = {
            "job_id": job,
            "forum_id": forum,
            "post_id": post,
            "depth": kind % 3 + 1,
            "version": f"{rng.randrange(500)}:2026-11-{rng.randrange(1, 28):02d}",
        }
        unique.append(Request(url, callback=cb, priority=prio, meta=meta))
    dups = [rng.choice(unique).copy() for _ in range(total - len(unique))]
    mixed = unique + dups
    rng.shuffle(mixed)
    return mixed


MakeRequests = Callable[[Spider], list[Request]]


@dataclass
class Result:
    enqueue_per_s: float
    dequeue_per_s: float
    dedup_bytes_per_fp: float
    queue_bytes_per_request: float
    accepted: int


def memory(client: redis.Redis, keys: list[str]) -> int:
    return sum(client.memory_usage(k, samples=0) or 0 for k in keys)


def measure(scheduler: Any, requests: list[Request], flush: Any, memory_of: Any) -> Result:
    """Enqueue all, read the memory, drain all: the same steps for both systems."""

    def enqueue() -> None:
        for request in requests:
            scheduler.enqueue_request(request)
        flush()

    enqueue_s = timed(enqueue)
    queued = len(scheduler.queue)
    dedup_bytes, queue_bytes = memory_of()
    popped, dequeue_s = drain(scheduler)
    assert popped == queued, (popped, queued)
    return Result(
        len(requests) / enqueue_s,
        popped / dequeue_s,
        dedup_bytes / queued,
        queue_bytes / queued,
        queued,
    )


def run_celery_crawl(url: str, make_requests: MakeRequests, prefix: str) -> Result:
    from celery_crawl.scheduler import Scheduler  # the settings path, before and after issue 29

    settings = {
        "REDIS_URL": url,
        "CELERY_CRAWL_KEY_PREFIX": prefix,
        "LOG_LEVEL": "WARNING",
        # every request is of one site and none is acked (nothing is downloaded): the site's
        # cap (Scrapy's 8 per domain) would stop the drain at 8. Its bookkeeping still runs.
        "SITE_CONCURRENCY": 0,
        "SITE_RATE": 0,
    }
    crawler = get_crawler(ForumSpider, settings)
    scheduler = Scheduler.from_crawler(crawler)
    spider = ForumSpider.from_crawler(crawler)
    scheduler.open(spider)
    queue = scheduler.queue

    def memory_of() -> tuple[int, int]:
        levels = [queue.keys.level(int(p)) for p in queue.client.zrange(queue.keys.queue, 0, -1)]
        return scheduler.df.memory_usage(), memory(queue.client, [queue.keys.queue, *levels])

    result = measure(scheduler, make_requests(spider), scheduler.flush, memory_of)
    scheduler.clear()
    return result


def run_scrapy_redis(url: str, make_requests: MakeRequests, prefix: str) -> Result:
    from scrapy_redis.scheduler import Scheduler

    crawler = get_crawler(
        ForumSpider,
        {
            "REDIS_URL": url,
            "LOG_LEVEL": "WARNING",
            "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
            "SCHEDULER_QUEUE_KEY": prefix + ":%(spider)s:requests",
            "SCHEDULER_DUPEFILTER_KEY": prefix + ":%(spider)s:dupefilter",
        },
    )
    scheduler = Scheduler.from_crawler(crawler)
    spider = ForumSpider.from_crawler(crawler)
    scheduler.open(spider)

    def memory_of() -> tuple[int, int]:
        client = scheduler.server
        return memory(client, [scheduler.df.key]), memory(client, [scheduler.queue.key])

    result = measure(scheduler, make_requests(spider), lambda: None, memory_of)
    scheduler.flush()
    return result


def timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def drain(scheduler: Any) -> tuple[int, float]:
    popped, started = 0, time.perf_counter()
    while scheduler.next_request() is not None:
        popped += 1
    return popped, time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--dup-ratio", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis-url")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=ScrapyDeprecationWarning)  # scrapy-redis's own
    results: dict[str, list[Result]] = {"celery_crawl": [], "scrapy-redis": []}
    with redis_url(args.redis_url) as url:
        for round_no in range(args.rounds):  # alternate, so drift hits both alike
            prefix = f"bench-{uuid.uuid4().hex[:8]}"
            # fresh Request objects each time: Scrapy caches fingerprints per object
            requests = functools.partial(workload, args.requests, args.dup_ratio)
            ours = run_celery_crawl(url, requests, prefix)
            theirs = run_scrapy_redis(url, requests, prefix)
            results["celery_crawl"].append(ours)
            results["scrapy-redis"].append(theirs)
            print(f"round {round_no + 1}/{args.rounds} done", flush=True)
        server = redis.Redis.from_url(url).info("server")
    report(results, args, server)


def report(
    results: dict[str, list[Result]], args: argparse.Namespace, server: dict[str, Any]
) -> None:
    ours, theirs = results["celery_crawl"], results["scrapy-redis"]
    metrics = [
        ("enqueue/s", "enqueue_per_s", "≥ 5×", lambda r: r >= 5),
        ("dequeue/s", "dequeue_per_s", "≥ 3×", lambda r: r >= 3),
        ("dedup bytes/fingerprint", "dedup_bytes_per_fp", "≤ 0.5×", lambda r: r <= 0.5),
        ("queue bytes/request", "queue_bytes_per_request", "≤ 0.5×", lambda r: r <= 0.5),
    ]
    rows = []
    for label, field, target, ok in metrics:
        a = median([getattr(r, field) for r in ours])
        b = median([getattr(r, field) for r in theirs])
        ratio = median(
            [getattr(x, field) / getattr(y, field) for x, y in zip(ours, theirs, strict=True)]
        )
        rows.append(
            [
                label,
                f"{a:,.1f}",
                f"{b:,.1f}",
                f"{ratio:.2f}×",
                target,
                "met" if ok(ratio) else "MISSED",
            ]
        )
    version = server.get("valkey_version") or server.get("redis_version")
    print(
        f"\n{args.requests} requests, {args.dup_ratio:.0%} duplicates,"
        f" median of {args.rounds} rounds, {server.get('server_name', 'redis')} {version};"
        f" accepted {ours[0].accepted} vs {theirs[0].accepted}\n"
    )
    print(
        table(
            ["metric", "celery_crawl", "scrapy-redis 0.9.1", "ratio (median)", "target", ""], rows
        )
    )


if __name__ == "__main__":
    main()
