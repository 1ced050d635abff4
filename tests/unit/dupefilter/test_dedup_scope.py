"""Dedup scope: a job's own filter by default, or the spider's, shared by its jobs (real server)."""

from __future__ import annotations

import pytest
import redis

from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.dupefilter.filters import KINDS, Kind
from celery_crawl.jobs.handle import Job
from celery_crawl.queue.queues import Base, PriorityQueue

FP = b"f" * 16


def queue(client: redis.Redis, prefix: str, scope: str) -> Base:
    return PriorityQueue(client, SpiderKeys.build("paths", prefix=prefix), dedup_scope=scope)


def start(q: Base, job: str, *fingerprints: bytes) -> int:
    seeds = [Entry(b"seed-" + fp, 0, fp, job) for fp in fingerprints]
    created, accepted = q.start_job(job, seeds, {"spider": "paths"})
    assert created
    return accepted


def finish(q: Base) -> None:
    """Lease and ack everything queued: the jobs end."""
    while leases := q.lease(100):
        q.ack([lease.member for lease in leases])


def test_job_scope_two_jobs_on_one_seed_both_crawl_it(client: redis.Redis, prefix: str) -> None:
    q = queue(client, prefix, "job")
    assert start(q, "a", FP) == 1
    assert start(q, "b", FP) == 1  # the spider's filter is not consulted
    child = [Entry(b"child", 0, b"c" * 16, "a"), Entry(b"again", 0, b"c" * 16, "a")]
    assert q.push_many(child) == [True, False]  # within a job, a duplicate is still one
    assert q.push_many([Entry(b"child-b", 0, b"c" * 16, "b")]) == [True]


def test_job_scope_a_job_run_again_crawls_again_and_its_set_goes(
    client: redis.Redis, prefix: str
) -> None:
    q = queue(client, prefix, "job")
    start(q, "first", FP)
    seen = q.keys.job("first") + ":seen"
    assert client.scard(seen) == 1
    finish(q)
    assert client.hget(q.keys.job("first"), "state") == b"done"
    assert not client.exists(seen)  # deleted when the job ended
    assert start(q, "second", FP) == 1
    assert q.push_many([Entry(b"no job", 0, FP, "")]) == [True]  # no job: the spider's filter


def test_spider_scope_jobs_share_the_spiders_filter(client: redis.Redis, prefix: str) -> None:
    q = queue(client, prefix, "spider")
    assert start(q, "a", FP) == 1
    assert start(q, "b", FP) == 0  # incremental: seen by job a
    assert not client.exists(q.keys.job("a") + ":seen")


def test_cancel_and_close_drop_the_jobs_own_set(client: redis.Redis, prefix: str) -> None:
    q = queue(client, prefix, "job")
    start(q, "cancelled", FP, b"g" * 16)
    start(q, "closed", FP)
    Job("cancelled", "paths", client, q.keys).cancel()
    assert q.job_store.end("closed", "a reason")
    assert not client.exists(q.keys.job("cancelled") + ":seen", q.keys.job("closed") + ":seen")


def test_an_unknown_scope_is_refused(client: redis.Redis, prefix: str) -> None:
    with pytest.raises(ConfigError, match="DUPEFILTER_SCOPE is 'site': use 'job' or 'spider'"):
        queue(client, prefix, "site")


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=lambda kind: kind.name)
def test_spider_scope_cancel_takes_the_purged_fingerprints_out_of_the_filter(
    client: redis.Redis, prefix: str, kind: Kind
) -> None:
    """Every kind forgets what the cancelled job never crawled, but bloom: a bit may be
    another fingerprint's too (its fragment's ``dedup_remove``)."""
    filter_class, forgets = kind.filter, kind.name != "bloom"
    keys = SpiderKeys.build("paths", prefix=prefix)
    dedup = filter_class(client, keys, None).script
    q = PriorityQueue(client, keys, dedup=dedup, dedup_scope="spider")
    crawled, queued = b"c" * 16, [bytes([n]) * 16 for n in range(1, 4)]
    q.start_job("a", [Entry(b"seed", 0, crawled, "a")], {"spider": "paths"})
    (lease,) = q.lease(1)
    assert (lease.job, lease.payload) == ("a", b"seed")  # the fingerprint it carries is skipped
    assert q.push_many([Entry(b"child-%d" % n, 0, fp, "a") for n, fp in enumerate(queued)])
    job = Job("a", "paths", client, keys, dedup=dedup)
    assert job.cancel() == 3
    assert job.status().state == "cancelled"
    dupefilter = filter_class(client, keys, None)
    assert dupefilter.seen_fingerprints([crawled, *queued]) == [True, *[not forgets] * 3]
    assert client.hget(keys.job("a"), "unfiltered") == (b"3" if forgets else None)
    if forgets:
        assert len(dupefilter) == 1  # counted out too
    q.ack([lease.member])
    assert start(q, "b", *queued) == (3 if forgets else 0)  # a later job crawls them


def test_job_scope_entries_carry_no_fingerprint(client: redis.Redis, prefix: str) -> None:
    q = queue(client, prefix, "job")
    start(q, "a", FP)
    (entry,) = client.lrange(q.keys.level(0), 0, -1)
    assert entry == bytes([1]) + b"a" + b"seed-" + FP
