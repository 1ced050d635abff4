"""Dedup memory: exact, bloom and expiring against scrapy-redis 0.9.1, in one run on one Redis.

For each filter, N fingerprints are inserted, its memory is read (``MEMORY
USAGE ... SAMPLES 0`` summed over the filter's keys), and then P fresh
fingerprints, never inserted, are probed without recording them: the share
reported seen is the measured false-positive rate.

- Fingerprints: Scrapy's ``RequestFingerprinter`` on distinct forum URLs.
- scrapy-redis: the same URLs through its own ``RFPDupeFilter.request_seen``
  (its own fingerprint: hex SHA-1 strings in one set), with a pipeline as its
  server so that its SADDs travel in batches; a probe counts as seen when its
  SADD added nothing, which is what ``request_seen`` tests.
- Expiring: the N fingerprints inside one long window, for bytes per
  fingerprint; then a steady stream of random 20-byte digests (the same
  distribution as SHA-1 fingerprints) through a short window for ``--windows``
  windows, with the memory printed at the end of each.

    python -m benchmarks.memory [--fingerprints 1000000] [--probes 200000] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import redis
from scrapy import Request
from scrapy.exceptions import ScrapyDeprecationWarning
from scrapy.utils.request import RequestFingerprinter

from benchmarks.common import redis_url, table
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.dupefilter.filters import (
    BloomDupeFilter,
    BloomParams,
    ExpiringDupeFilter,
    ExpiringParams,
    RFPDupeFilter,
)

BATCH = 10_000
LONG_WINDOW = ExpiringParams(window_ms=3_600_000, buckets=24)


@dataclass
class Row:
    name: str
    fingerprints: int
    bytes: int
    probes: int
    false_positives: int

    @property
    def per_fp(self) -> float:
        return self.bytes / self.fingerprints

    @property
    def fp_rate(self) -> float:
        return self.false_positives / self.probes


def url(i: int) -> str:
    return f"http://127.0.0.1:8000/post/{i}"


def batches(start: int, count: int) -> Iterator[range]:
    for first in range(start, start + count, BATCH):
        yield range(first, min(first + BATCH, start + count))


def scrapy_fingerprints(start: int, count: int) -> list[bytes]:
    fingerprinter = RequestFingerprinter()
    return [fingerprinter.fingerprint(Request(url(i))) for i in range(start, start + count)]


def measure(name: str, df: RFPDupeFilter, inserted: list[bytes], probes: list[bytes]) -> Row:
    for first in range(0, len(inserted), BATCH):
        df.add_fingerprints(inserted[first : first + BATCH])
    used = df.memory_usage()
    seen = 0
    for first in range(0, len(probes), BATCH):
        seen += sum(df.seen_fingerprints(probes[first : first + BATCH]))
    df.clear()
    return Row(name, len(inserted), used, len(probes), seen)


def measure_scrapy_redis(client: redis.Redis, key: str, count: int, probes: int) -> Row:
    from scrapy_redis.dupefilter import RFPDupeFilter as ScrapyRedisDupeFilter

    pipe = client.pipeline(transaction=False)
    df = ScrapyRedisDupeFilter(pipe, key)

    def run(start: int, total: int) -> int:
        seen = 0
        for chunk in batches(start, total):
            for i in chunk:
                df.request_seen(Request(url(i)))
            seen += sum(added == 0 for added in pipe.execute())
        return seen

    run(0, count)
    used = client.memory_usage(key, samples=0) or 0
    false_positives = run(count, probes)
    client.delete(key)
    return Row("scrapy-redis 0.9.1 set", count, used, probes, false_positives)


def expiring_series(
    df: ExpiringDupeFilter, window: float, windows: int, rate: int, tick: float = 0.05
) -> list[tuple[int, int, int, int]]:
    """A steady stream for ``windows`` windows: (window, added, fingerprints held, bytes) each.

    Paced by the wall clock: at any moment, ``rate`` fingerprints a second so far.
    """
    rng, series, added = random.Random(1), [], 0
    started = time.monotonic()
    for number in range(1, windows + 1):
        end = started + number * window
        while (now := time.monotonic()) < end:
            due = int(rate * (now - started)) - added
            df.add_fingerprints([rng.randbytes(20) for _ in range(due)])
            added += due
            time.sleep(min(tick, max(0.0, end - time.monotonic())))
        series.append((number, added, len(df), df.memory_usage()))
    df.clear()
    return series


def run(args: argparse.Namespace, client: redis.Redis, keys: SpiderKeys) -> list[Row]:
    """Every filter on the same fingerprints, one after the other, on the same Redis."""
    n, p = args.fingerprints, args.probes
    progress(f"fingerprinting {n:,} + {p:,} URLs")
    inserted, fresh = scrapy_fingerprints(0, n), scrapy_fingerprints(n, p)
    filters: list[tuple[str, RFPDupeFilter]] = [
        ("exact (default)", RFPDupeFilter(client, keys, None)),
        ("bloom", BloomDupeFilter(client, keys, None, params=BloomParams(capacity=args.capacity))),
        ("expiring, 1 h window", ExpiringDupeFilter(client, keys, None, params=LONG_WINDOW)),
    ]
    rows = []
    for name, df in filters:
        progress(name)
        rows.append(measure(name, df, inserted, fresh))
    progress("scrapy-redis")
    rows.append(measure_scrapy_redis(client, keys.dupefilter, n, p))
    return rows


STARTED = time.monotonic()


def progress(label: str) -> None:
    print(f"[{time.monotonic() - STARTED:5.0f} s] {label}...", file=sys.stderr, flush=True)


def report(rows: list[Row], capacity: int) -> None:
    anchor = rows[-1]
    print(
        table(
            [
                "filter",
                "fingerprints",
                "bytes",
                "bytes/fp",
                "vs scrapy-redis",
                "probes",
                "false positives",
                "FP rate",
            ],
            [
                [
                    row.name,
                    f"{row.fingerprints:,}",
                    f"{row.bytes:,}",
                    f"{row.per_fp:.2f}",
                    f"{row.per_fp / anchor.per_fp:.3f}×",
                    f"{row.probes:,}",
                    f"{row.false_positives:,}",
                    f"{row.fp_rate:.4%}",
                ]
                for row in rows
            ],
        )
    )
    exact, bloom = rows[0], rows[1]
    print(f"\nbloom capacity {capacity:,} ({BloomParams().error_rate} error rate, the defaults)")
    targets = [
        ("bloom ≤ 2 bytes/fp", bloom.per_fp <= 2),
        ("bloom FP rate ≤ 0.1%", bloom.fp_rate <= 0.001),
        ("exact ≤ 0.5× scrapy-redis", exact.per_fp <= 0.5 * anchor.per_fp),
    ]
    for label, met in targets:
        print(f"- {label}: {'met' if met else 'MISSED'}")


def report_series(series: list[tuple[int, int, int, int]], args: argparse.Namespace) -> None:
    print(
        f"\nexpiring: {args.window:g} s window in {args.buckets} buckets,"
        f" {args.rate:,} fingerprints/s for {args.windows} windows\n"
    )
    print(
        table(
            ["end of window", "added so far", "fingerprints held", "bytes"],
            [[w, f"{a:,}", f"{h:,}", f"{b:,}"] for w, a, h, b in series],
        )
    )
    steady = [b for _, _, _, b in series[2:]]  # from the third window on, buckets expire
    flat = max(steady) <= 1.25 * min(steady)
    print(f"\n- memory flat from window 3 on (max ≤ 1.25× min): {'met' if flat else 'MISSED'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fingerprints", type=int, default=1_000_000)
    parser.add_argument("--probes", type=int, default=200_000)
    parser.add_argument("--capacity", type=int, default=BloomParams().capacity)
    parser.add_argument("--window", type=float, default=1.0, help="expiring stream, seconds")
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--rate", type=int, default=20_000, help="fingerprints/s in the stream")
    parser.add_argument("--redis-url")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=ScrapyDeprecationWarning)
    with redis_url(args.redis_url) as url_:
        client = redis.Redis.from_url(url_)
        keys = SpiderKeys.build("forum", prefix=f"bench-{uuid.uuid4().hex[:8]}")
        rows = run(args, client, keys)
        progress("expiring stream")
        short = ExpiringParams(window_ms=round(args.window * 1000), buckets=args.buckets)
        series = expiring_series(
            ExpiringDupeFilter(client, keys, None, params=short),
            args.window,
            args.windows,
            args.rate,
        )
        server = client.info("server")
    version = server.get("valkey_version") or server.get("redis_version")
    print(f"$ python -m benchmarks.memory {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"{server.get('server_name', 'redis')} {version}\n")
    report(rows, args.capacity)
    report_series(series, args)
    print(f"\n{time.monotonic() - STARTED:.0f} s in all")


if __name__ == "__main__":
    main()
