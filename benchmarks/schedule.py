"""What a producer tick costs with many sources: due-time schedule against the source list.

For each N, N sources of one spider are registered. Each timed tick
(``Schedule.reserve``, ``producer/lua/schedule_tick.lua``) finds the ``--due`` jobs of the
tick before ended (their sources' next due times set) and reserves ``--due`` other
sources that are due, ``--rounds`` times. Beside it, in the same run, on the
same Redis:

- the list producer (``Producer.reserve``, ``producer/lua/produce.lua``), which is handed
  every source at every tick and reserves ``--due`` of them (its job cap);
- the anchor, scrapy-redis 0.9.1, has no sources or schedules: a scrapy-redis crawl fed
  by cron pushes every source's start URL into the spider's start key at every period
  (one pipelined ``LPUSH`` of N URLs, then the key deleted).

    python -m benchmarks.schedule [--sources 1000 10000 100000] [--due 100] [--rounds 7]

scrapy-redis is not imported: what it costs here is Redis's work on its start key.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

import redis

from benchmarks.common import median, redis_url, table
from celery_crawl.core import scripts
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.producer.producer import Producer
from celery_crawl.producer.schedule import PUT, Schedule, Source

CAP = 10**9  # queue cap: never reached


def register(client: redis.Redis, keys: SpiderKeys, count: int, due: int) -> list[str]:
    """``count`` sources, put through the schedule's own script (pipelined); ``due`` due now.

    The keys are the schedule's (``Schedule.put``), sent pipelined for speed."""
    put = scripts.script(client, PUT.script)
    ids = [f"s{i:07d}" for i in range(count)]
    put_keys = [
        keys.schedule_sources,
        keys.schedule_due,
        keys.schedule_paused,
        keys.schedule_intervals,
        keys.producer_running,
    ]
    for start in range(0, count, 5000):
        with client.pipeline(transaction=False) as pipe:
            for source_id in ids[start : start + 5000]:
                source = Source(source_id, seeds=[source_id], interval=3600)
                args = PUT.build(
                    source_id=source_id, definition=source.to_json(), interval=3600, paused=0
                )
                put(keys=put_keys, args=args, client=pipe)
            pipe.execute()
    later = int((time.time() + 3600) * 1000)
    for start in range(due, count, 5000):  # all but the first ``due`` are due in an hour
        client.zadd(keys.schedule_due, dict.fromkeys(ids[start : start + 5000], later))
    return ids


def timed(rounds: int, setup: Callable[[], object], run: Callable[[], object]) -> float:
    """The median milliseconds of ``run``, ``setup`` (untimed) before each."""
    times = []
    for _ in range(rounds):
        setup()
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return median(times)


def measure(client: redis.Redis, count: int, due: int, rounds: int) -> list[object]:
    prefix = f"bench-schedule-{uuid.uuid4().hex[:8]}"
    keys = SpiderKeys.build("sources", prefix=prefix)
    try:
        ids = register(client, keys, count, due)
        schedule = Schedule(client, keys)
        turn = iter(range(10**6))

        def due_again() -> None:
            """The jobs of the last tick ended; ``due`` other sources due now: a tick handles
            both, the ends (the next due times) and the reservations."""
            running = client.hgetall(keys.producer_running)
            with client.pipeline(transaction=False) as pipe:
                for value in running.values():
                    pipe.hset(keys.job(value.decode().partition("|")[0]), "state", "done")
                first = due * (next(turn) % 2)
                now = int(time.time() * 1000)
                pipe.zadd(keys.schedule_due, dict.fromkeys(ids[first : first + due], now))
                pipe.execute()

        def scheduled() -> None:
            tick = schedule.reserve(due, CAP, 0.8, 1.4)
            assert len(tick.produced) == due, len(tick.produced)

        schedule_ms = timed(rounds, due_again, scheduled)
        client.delete(keys.producer_running)
        producer = Producer(client, keys, job_cap=due, queue_cap=CAP)
        listed = timed(
            rounds,
            lambda: client.delete(keys.producer_running),
            lambda: producer.reserve(ids),
        )
        start_key = f"{prefix}:start_urls"
        urls = [f"http://127.0.0.1:8000/forum/{source_id}" for source_id in ids]

        def push_all() -> None:
            with client.pipeline(transaction=False) as pipe:
                for start in range(0, count, 10_000):
                    pipe.lpush(start_key, *urls[start : start + 10_000])
                pipe.execute()

        anchor = timed(rounds, lambda: client.delete(start_key), push_all)
    finally:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
    return [
        f"{count:,}",
        f"{schedule_ms:.2f}",
        f"{listed:.2f}",
        f"{anchor:.2f}",
        f"{listed / schedule_ms:.1f}×",
        f"{anchor / schedule_ms:.1f}×",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--due", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    with redis_url(args.redis_url) as url:
        client = redis.Redis.from_url(url)
        rows = [measure(client, count, args.due, args.rounds) for count in args.sources]
    print(f"\nmedian ms per tick, {args.due} sources due, {args.rounds} rounds\n")
    headers = [
        "sources",
        "schedule tick (ms)",
        "list producer tick (ms)",
        "scrapy-redis: push every start URL (ms)",
        "list / schedule",
        "scrapy-redis / schedule",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
