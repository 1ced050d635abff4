"""Poison in the queue: entries that cannot be read are dead-lettered once, in the step that
meets them, counted, and never reach Scrapy's engine. On a real server, with a real scheduler."""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import redis
from scrapy import Request

from celery_crawl.core.entries import Entry
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.jobs.store import end_lost_jobs
from celery_crawl.queue.queues import PriorityQueue
from tests.support.schedulers import drain, open_scheduler

STAT = "celery_crawl/dead_letter/malformed"


def poison_entries(job: bytes) -> list[bytes]:
    """The kinds the issue found, and the header's other ways to be wrong."""
    return [
        os.urandom(40),  # random bytes: a random header, most likely an unknown job
        bytes([len(job)]) + job,  # the job's prefix and nothing after it
        b"",  # empty
        bytes([60]) + b"ab",  # a job id length past the end
        bytes([0x80 | len(job)]) + job,  # a fingerprint flag and nothing after the job id
        bytes([0x40 | len(job)]) + job + b"\x00request",  # an empty site
        bytes([len(b"ghost")]) + b"ghost" + b"payload",  # a job that does not exist
    ]


def encode(scheduler: Any, url: str) -> bytes:
    assert scheduler.spider is not None
    return bytes(scheduler.codec.encode(Request(url), scheduler.spider))


def push_raw(client: redis.Redis, keys: SpiderKeys, entries: list[bytes], priority: int) -> None:
    client.rpush(f"{keys.queue}:{priority}", *entries)
    client.zadd(keys.queue, {str(priority): -priority})


def records(client: redis.Redis, keys: SpiderKeys) -> list[dict[str, Any]]:
    return [json.loads(r) for r in client.lrange(keys.deadletter, 0, -1)]


def test_poison_is_dead_lettered_once_and_never_reaches_the_engine(
    make_crawler: Any, client: redis.Redis
) -> None:
    scheduler = open_scheduler(make_crawler(SCHEDULER_PREFETCH=4))
    keys = scheduler.queue.keys
    scheduler.queue.start_job("j1", [], {})
    client.hset(keys.job("j1"), mapping={"state": "running", "pending": 7})  # as if queued
    push_raw(client, keys, poison_entries(b"j1"), priority=100)
    scheduler.enqueue_request(Request("http://127.0.0.1/post/1"))
    scheduler.flush()

    got = [scheduler.next_request() for _ in range(12)]  # never raises
    assert [r.url for r in got if r is not None] == ["http://127.0.0.1/post/1"]
    scheduler.flush()
    dead = records(client, keys)
    malformed = [r for r in dead if r["stage"] == "lease"]
    assert len(dead) == 7 and len(malformed) >= 6
    assert all(r["reason"] == "malformed" and "entry_hex" in r for r in malformed)
    # the random entry, when its header reads as a request of no job (1 in about 60):
    # leased, and refused by the codec, dead-lettered with its ack
    assert all(r["reason"] == "undecodable" for r in dead if r["stage"] != "lease")
    assert int(client.hget(keys.stats, STAT) or 0) == len(malformed)
    assert client.zcard(keys.inflight) == 1  # only the good request, still held
    assert len(scheduler.queue) == 0

    scheduler.queue.requeue_expired()  # nothing comes back: poison is never retried
    assert [scheduler.next_request() for _ in range(3)] == [None] * 3
    assert len(records(client, keys)) == 7


def test_a_job_whose_entries_were_poisoned_still_ends_and_counts_them(
    make_crawler: Any, client: redis.Redis
) -> None:
    """Poison leaves the pending count alone; once the queue is empty, the job whose
    count it was in ends (jobs/lua/job_reconcile.lua) and says how many were poison."""
    scheduler = open_scheduler(make_crawler())
    keys = scheduler.queue.keys
    scheduler.queue.start_job("j2", [], {})
    broken = [bytes([2]) + b"j2", bytes([0x80 | 2]) + b"j2"]  # the job's, headers broken
    client.hset(keys.job("j2"), mapping={"state": "running", "pending": len(broken)})
    client.sadd(keys.active_jobs, "j2")  # as if its entries had been queued by it
    push_raw(client, keys, broken, priority=0)
    assert scheduler.next_request() is None
    assert client.hget(keys.job("j2"), "state") == b"running"
    assert end_lost_jobs(client, [keys], grace_seconds=0) == []  # first seen
    assert end_lost_jobs(client, [keys], grace_seconds=0) == ["j2"]
    job = client.hgetall(keys.job("j2"))
    assert job[b"state"] == b"failed"  # not one page came back
    assert job[b"errors/dead_letter/malformed"] == b"2" and job[b"errors/lost"] == b"2"


def test_poison_naming_a_running_job_never_ends_it_early(
    make_crawler: Any, client: redis.Redis
) -> None:
    """Entries written with a running job's id but never counted in it (an adversary's)."""
    scheduler = open_scheduler(make_crawler(SCHEDULER_PREFETCH=1))
    keys = scheduler.queue.keys
    url = "http://127.0.0.1/post/1"
    scheduler.queue.start_job("j3", [Entry(encode(scheduler, url), job="j3")], {})
    push_raw(client, keys, [bytes([2]) + b"j3" + b"\xc1" * 20] * 3, priority=100)
    requests = drain(scheduler)
    assert [r.url for r in requests] == [url]
    scheduler.flush()
    assert client.hget(keys.job("j3"), "state") == b"running"  # its request is not done yet
    client.hincrby(keys.job("j3"), "pages", 1)  # as its response would
    scheduler.ack(requests[0])
    scheduler.flush()
    job = client.hgetall(keys.job("j3"))
    assert job[b"state"] == b"done", job
    assert sum(int(v) for k, v in job.items() if k.startswith(b"errors/dead_letter/")) == 3
    assert job[b"leased"] == job[b"pending"] == b"0"


def test_a_broken_lease_in_flight_is_dead_lettered_not_requeued(
    client: redis.Redis, prefix: str
) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("poison", prefix=prefix), lease_seconds=60)
    short = b"\x00\x00\x00"  # shorter than a lease header
    broken = struct.pack(">IIi", 0, 1, 0) + bytes([9]) + b"ab"  # its entry's header broken
    client.zadd(queue.keys.inflight, {short: 0, broken: 0})  # both expired long ago
    assert queue.requeue_expired() == 0
    assert client.zcard(queue.keys.inflight) == 0 and len(queue) == 0
    dead = records(client, queue.keys)
    assert sorted(r["error"] for r in dead) == [
        "a job id longer than the entry",
        "a lease shorter than its header",
    ]
    assert {r["stage"] for r in dead} == {"requeue"}


def test_an_expired_lease_of_an_unknown_job_is_dead_lettered_not_dropped(
    client: redis.Redis, prefix: str
) -> None:
    """Found by the fault suite: one random junk lease in 16 reads as an unknown job's."""
    queue = PriorityQueue(client, SpiderKeys.build("poison", prefix=prefix), lease_seconds=60)
    queue.start_job("ended", [], {})
    client.hset(queue.keys.job("ended"), "state", "cancelled")
    ghost = struct.pack(">IIi", 0, 1, 0) + bytes([5]) + b"ghost" + b"payload"
    ended = struct.pack(">IIi", 0, 2, 0) + bytes([5]) + b"ended" + b"payload"
    client.zadd(queue.keys.inflight, {ghost: 0, ended: 0})  # both expired long ago
    assert queue.requeue_expired() == 0
    assert client.zcard(queue.keys.inflight) == 0 and len(queue) == 0
    [dead] = records(client, queue.keys)  # the ended job's request is discarded, not poison
    assert (dead["error"], dead["stage"]) == ("an unknown job", "requeue")
    assert client.hget(queue.keys.stats, STAT) == b"1"


def test_a_request_the_codec_cannot_rebuild_is_dead_lettered_with_its_ack(
    make_crawler: Any, client: redis.Redis
) -> None:
    scheduler = open_scheduler(make_crawler())
    keys = scheduler.queue.keys
    push_raw(client, keys, [bytes([0]) + b"\x93\x01\x02"], priority=0)  # msgpack, not a request
    assert scheduler.next_request() is None
    scheduler.flush()
    (record,) = records(client, keys)
    assert record["stage"] == "dequeue" and client.zcard(keys.inflight) == 0


REFUSED = {
    "file:///etc/passwd": "refused_scheme",
    "data:,secret": "refused_scheme",
    "ftp://127.0.0.1/pub/x": "refused_scheme",
    "s3://bucket/key": "refused_scheme",
}


def test_entries_of_a_refused_scheme_or_method_are_dead_lettered_never_handed_out(
    make_crawler: Any, client: redis.Redis
) -> None:
    """What a Redis writer can push: file://, data:, ftp://, s3:// and a PUT. Default policy."""
    scheduler = open_scheduler(make_crawler())
    keys = scheduler.queue.keys
    assert scheduler.spider is not None
    put = Request("http://127.0.0.1/admin", method="PUT", body=b"{}")
    written = [encode(scheduler, url) for url in REFUSED]
    written.append(bytes(scheduler.codec.encode(put, scheduler.spider)))
    good = [encode(scheduler, "http://127.0.0.1/post/1"), encode(scheduler, "https://a.test/")]
    good.append(
        bytes(scheduler.codec.encode(Request("http://a.test/f", method="POST"), scheduler.spider))
    )
    push_raw(client, keys, [bytes([0]) + entry for entry in written + good], priority=0)

    handed_out = drain(scheduler, limit=20)
    scheduler.flush()
    assert sorted(r.url for r in handed_out) == [
        "http://127.0.0.1/post/1",
        "http://a.test/f",
        "https://a.test/",
    ]
    dead = records(client, keys)
    assert sorted(r["reason"] for r in dead) == ["refused_method"] + ["refused_scheme"] * 4
    assert {r["stage"] for r in dead} == {"dequeue"}
    assert any("'file'" in r["error"] for r in dead) and any("'PUT'" in r["error"] for r in dead)
    assert scheduler.stats is not None  # the crawler's stats: shared by the stats collector
    assert scheduler.stats.get_value("celery_crawl/dead_letter/refused_scheme") == 4
    assert scheduler.stats.get_value("celery_crawl/dead_letter/refused_method") == 1
    assert client.zcard(keys.inflight) == 3 and len(scheduler.queue) == 0  # only the good ones


def test_the_allowed_schemes_and_methods_are_settings(
    make_crawler: Any, client: redis.Redis
) -> None:
    crawler = make_crawler(
        SCHEDULER_ALLOWED_SCHEMES=["HTTP", "data"], SCHEDULER_ALLOWED_METHODS=["get"]
    )
    scheduler = open_scheduler(crawler)
    keys = scheduler.queue.keys
    assert scheduler.spider is not None
    post = Request("http://a.test/form", method="POST")
    entries = [encode(scheduler, "data:,ok"), encode(scheduler, "https://a.test/")]
    entries.append(bytes(scheduler.codec.encode(post, scheduler.spider)))
    push_raw(client, keys, [bytes([0]) + entry for entry in entries], priority=0)
    assert [r.url for r in drain(scheduler, limit=10)] == ["data:,ok"]
    scheduler.flush()
    assert sorted(r["reason"] for r in records(client, keys)) == [
        "refused_method",
        "refused_scheme",
    ]
