"""Per-site limits at scale: Redis memory and commands per site, and the lease's cost.

For each count of sites, one queue holds two requests of every site, each
site capped at one request in flight: a first pass of leases takes one
request of every site and parks the other (``queue/lua/lease.lua``), as a crawl of
many sites at their caps does. Then:

- **bytes per site**: ``MEMORY USAGE`` summed over the keys of the sites and
  of the parked entries, while one request of each site is leased and the
  other parked, divided by the sites: the site's state hash, its lease, its
  parked levels with the one parked request (about 130 bytes of it), and its
  places in the indexes;
- **commands per request**: Redis commands run (``INFO commandstats``, the
  scripts' own calls included) per request leased, over the whole crawl of
  the queue: the first pass, then acks that free each site and the leases
  that take its parked request; against the same queue without limits;
- **µs per script call**: the server's time per lease or ack call
  (``EVALSHA`` in ``commandstats``), with and without limits.

    python -m benchmarks.sites [--sites 100 1000 10000] [--batch 16] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import uuid
from dataclasses import dataclass

import redis

from benchmarks.common import redis_url, table
from celery_crawl.core.entries import Entry
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.politeness.sites import Limits, SitePolicy
from celery_crawl.queue.queues import PriorityQueue

PAYLOAD = b"x" * 120  # about an encoded forum request


@dataclass(frozen=True)
class Cost:
    memory: int  # bytes the queue and its sites hold after the first pass
    commands: int  # Redis commands, scripts' own included, over the whole crawl
    script_calls: int
    script_usec: float  # server time in script calls (push, lease, ack)
    leased: int


def commands(client: redis.Redis) -> tuple[int, int, float]:
    """(all commands, EVALSHA calls, EVALSHA µs) from INFO commandstats."""
    stats = client.info("commandstats")
    total = sum(int(v["calls"]) for v in stats.values())
    evalsha = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return total, int(evalsha["calls"]), float(evalsha["usec"])


def crawl(client: redis.Redis, sites: int, batch: int, limited: bool) -> Cost:
    """Queue two requests per site, lease and ack them all; what it cost the server."""
    client.flushdb()
    keys = SpiderKeys.build("sites_bench", prefix=f"bench-{uuid.uuid4().hex[:8]}")
    policy = SitePolicy(limits=Limits(concurrency=1)) if limited else SitePolicy(enabled=False)
    queue = PriorityQueue(client, keys, lease_seconds=600, sites=policy)
    names = [f"site{n}.example" for n in range(sites)]
    for start in range(0, sites, 500):
        chunk = names[start : start + 500]
        queue.push_many([Entry(PAYLOAD, 0, None, "", s if limited else "") for s in chunk] * 2)
    before = commands(client)
    held = first_pass(queue, batch, sites)  # one request of each site leased, one waiting
    memory = site_memory(client, keys)
    leased = len(held)
    for _ in range(4 * sites):  # bounded: ack what is held, lease what that frees
        if not held:
            break
        queue.ack(held[:batch])
        more = [lease.member for lease in queue.lease(batch)]
        held, leased = held[batch:] + more, leased + len(more)
    after = commands(client)
    assert leased == 2 * sites and len(queue) == 0, (leased, len(queue))
    return Cost(memory, after[0] - before[0], after[1] - before[1], after[2] - before[2], leased)


def site_memory(client: redis.Redis, keys: SpiderKeys) -> int:
    """``MEMORY USAGE`` summed over the sites' keys and the parked entries' keys."""
    total = 0
    for pattern in (keys.site_prefix + "*", keys.parked + "*"):
        for key in client.scan_iter(match=pattern.replace("{", "[{]"), count=1000):
            total += int(client.memory_usage(key, samples=0) or 0)
    return total


def first_pass(queue: PriorityQueue, batch: int, sites: int) -> list[bytes]:
    """Lease until ``sites`` requests are held (with limits: one per site, the rest parked)."""
    held: list[bytes] = []
    for _ in range(4 * sites // batch + 10):  # bounded: each call leases or parks
        held += [lease.member for lease in queue.lease(batch)]
        if len(held) >= sites:
            break
    return held


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--batch", type=int, default=16, help="requests per lease (PREFETCH)")
    parser.add_argument("--redis-url")
    args = parser.parse_args(argv)
    rows = []
    with redis_url(args.redis_url) as url:
        client = redis.Redis.from_url(url)
        for sites in args.sites:
            plain = crawl(client, sites, args.batch, limited=False)
            limited = crawl(client, sites, args.batch, limited=True)
            rows.append(
                [
                    f"{sites:,}",
                    f"{limited.memory / sites:,.0f}",
                    f"{plain.commands / plain.leased:.1f}",
                    f"{limited.commands / limited.leased:.1f}",
                    f"{plain.script_usec / max(plain.script_calls, 1):.0f}",
                    f"{limited.script_usec / max(limited.script_calls, 1):.0f}",
                ]
            )
    print(
        f"\ntwo requests per site, each site capped at 1 in flight; {args.batch} requests"
        " per lease; every request leased and acked\n"
    )
    headers = [
        "sites",
        "bytes per site (limits)",
        "commands / request, no limits",
        "commands / request, limits",
        "µs / script call, no limits",
        "µs / script call, limits",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
