"""Damaged keys on a real server: moved aside, counted, and the work kept; lost work ends jobs."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from scrapy import Request

from celery_crawl.core.entries import Entry
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.core.repair import Repair, Repairer, repair, retried
from celery_crawl.jobs.store import end_lost_jobs
from celery_crawl.queue.queues import PriorityQueue
from tests.support.schedulers import drain, open_scheduler

DAMAGED = "celery_crawl/damaged/keys"


def test_keys_of_the_wrong_type_are_moved_aside_and_counted(
    client: redis.Redis, prefix: str
) -> None:
    keys = SpiderKeys.build("r", prefix=prefix)
    client.set(keys.signal, "x")  # a fixed key
    client.set(keys.dupefilter_count, "not a number")  # a counter
    client.zadd(keys.queue, {"5": -5})
    client.set(keys.level(5), "x")  # a level the index names
    client.rpush(keys.level(0), b"untouched")  # not named by the index: not looked at
    done = repair(client, keys)
    assert sorted(done.moved) == sorted([keys.signal, keys.dupefilter_count, keys.level(5)])
    assert client.get(keys.signal + "~damaged") == b"x"
    assert client.exists(keys.signal, keys.dupefilter_count, keys.level(5)) == 0
    assert int(client.hget(keys.stats, DAMAGED) or 0) == 3
    assert not repair(client, keys)  # nothing left to do


def test_a_job_whose_counter_is_not_a_number_ends_closed(client: redis.Redis, prefix: str) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    keys = queue.keys
    queue.start_job("j", [Entry(b"seed", job="j")], {})
    client.hset(keys.job("j"), "pending", "x")
    done = repair(client, keys)
    assert done.jobs_ended == ["j"]
    job = client.hgetall(keys.job("j"))
    assert job[b"state"] == b"closed" and job[b"reason"] == b"damaged: pending"
    assert job[b"pending~damaged"] == b"x" and job[b"pending"] == b"0"
    assert int(client.hget(keys.stats, "celery_crawl/damaged/jobs") or 0) == 1


def test_a_refused_flush_keeps_its_requests_and_repairs_the_keys(
    make_crawler: Any, client: redis.Redis
) -> None:
    """A dedup bucket of the wrong type: the flush fails, nothing is lost, none reaches
    the caller, and once the key is moved aside the next flush writes the requests."""
    scheduler = open_scheduler(make_crawler())
    keys = scheduler.queue.keys
    for generation_bucket in range(128):
        client.set(f"{keys.dupefilter}:0:{generation_bucket}", "x")
    urls = [f"http://127.0.0.1/post/{i}" for i in range(5)]
    for url in urls:
        scheduler.enqueue_request(Request(url))
    scheduler.flush()  # refused: kept, repaired
    assert len(scheduler.buffer) == 5
    assert int(client.hget(keys.stats, DAMAGED) or 0) == 128
    scheduler.flush()
    assert sorted(r.url for r in drain(scheduler)) == urls


def test_a_job_whose_requests_are_gone_ends_incomplete(client: redis.Redis, prefix: str) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    keys = queue.keys
    queue.start_job("lost", [Entry(b"a", job="lost"), Entry(b"b", job="lost")], {})
    assert end_lost_jobs(client, [keys], grace_seconds=0) == []  # still queued
    client.hincrby(keys.job("lost"), "pages", 1)  # some came back (none: it ends failed)
    client.delete(keys.queue)  # the index: its lists are not found again
    assert end_lost_jobs(client, [keys], grace_seconds=0) == []  # first seen: marked
    assert end_lost_jobs(client, [keys], grace_seconds=0) == ["lost"]
    job = client.hgetall(keys.job("lost"))
    assert job[b"state"] == b"incomplete"
    assert job[b"lost"] == b"2" and job[b"errors/lost"] == b"2" and job[b"pending"] == b"0"


def test_a_job_that_made_progress_is_not_ended_as_lost(client: redis.Redis, prefix: str) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    keys = queue.keys
    queue.start_job("slow", [Entry(b"a", job="slow"), Entry(b"b", job="slow")], {})
    assert len(queue.lease(2)) == 2
    client.delete(keys.inflight)  # Redis forgot both leases; the process still works
    assert end_lost_jobs(client, [keys], grace_seconds=3600) == []  # marked
    assert end_lost_jobs(client, [keys], grace_seconds=3600) == []  # not for long enough
    client.hincrby(keys.job("slow"), "done", 1)  # a request of it was done meanwhile
    assert end_lost_jobs(client, [keys], grace_seconds=0) == []  # progress: marked again
    assert client.hget(keys.job("slow"), "state") == b"running"


def test_a_job_whose_state_is_damaged_ends_closed(client: redis.Redis, prefix: str) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    keys = queue.keys
    queue.start_job("odd", [Entry(b"a", job="odd")], {})
    assert end_lost_jobs(client, [keys], grace_seconds=0) == []  # queued: not looked at
    queue.push_many([], acks=[lease.member for lease in queue.lease(1)])  # done
    queue.start_job("odd2", [Entry(b"b", job="odd2")], {})
    client.hset(keys.job("odd2"), "state", "garbled")
    client.delete(keys.queue)  # its request gone too: the queues are empty
    assert end_lost_jobs(client, [keys], grace_seconds=0) == ["odd2"]
    job = client.hgetall(keys.job("odd2"))
    assert job[b"state"] == b"closed" and job[b"reason"] == b"damaged: state"


def test_a_damaged_counter_never_fails_a_lease_half_way(client: redis.Redis, prefix: str) -> None:
    """The soak's find: with the poison counter turned to text, the lease script failed
    after popping its entries, and the ones not yet recorded were gone."""
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    keys = queue.keys
    queue.start_job("j", [Entry(b"real", job="j")], {})
    client.rpush(keys.level(0), b"", b"\x05ab", bytes([60]) + b"ab")  # poison after it
    client.hset(keys.stats, "celery_crawl/dead_letter/malformed", "garbage")
    (lease,) = queue.lease(10)
    assert lease.payload == b"real"
    assert client.llen(keys.deadletter) == 3 and len(queue) == 0
    assert client.hget(keys.stats, "celery_crawl/dead_letter/malformed") == b"3"
    assert client.hget(keys.stats, "celery_crawl/dead_letter/malformed~damaged") == b"garbage"


@pytest.mark.parametrize("damaged", ["inflight", "seq", "deadletter", "level"])
def test_a_lease_meeting_a_key_of_the_wrong_type_pops_nothing_until_repaired(
    client: redis.Redis, prefix: str, damaged: str
) -> None:
    """Redis keeps what a failing script did: the lease checks its keys before it pops."""
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    keys = queue.keys
    queue.start_job("j", [Entry(b"high", 9, job="j"), Entry(b"low", 0, job="j")], {})
    key = {"inflight": keys.inflight, "seq": keys.seq, "deadletter": keys.deadletter}.get(
        damaged, keys.level(5)
    )
    if damaged == "level":  # a level below the job's first: met only after a pop
        client.zadd(keys.queue, {"5": -5})
    client.set(key, "not of its type")
    with pytest.raises(redis.ResponseError, match=f"WRONGTYPE damaged key {key}"):
        queue.lease(10)
    assert client.llen(keys.level(9)) == client.llen(keys.level(0)) == 1  # nothing popped
    assert repair(client, keys).moved == [key]
    assert sorted(lease.payload for lease in queue.lease(10)) == [b"high", b"low"]


def test_a_level_list_past_the_checked_ones_stops_the_lease_before_it(
    client: redis.Redis, prefix: str
) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    keys = queue.keys
    queue.start_job("j", [Entry(b"low", 0, job="j")], {})
    client.zadd(keys.queue, {"9": -9, "8": -8, "7": -7})  # 9 and 8 named, their lists gone
    client.set(keys.level(7), "not a list")
    assert queue.lease(2) == []  # 9 and 8 checked; 7 met in the loop: stopped before it
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        queue.lease(2)  # now among the checked ones: refused
    repair(client, keys)
    assert [lease.payload for lease in queue.lease(2)] == [b"low"]


def test_a_requeue_into_a_list_of_the_wrong_type_keeps_every_lease_until_repaired(
    client: redis.Redis, prefix: str
) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    keys = queue.keys
    queue.start_job("j", [Entry(b"high", 9, job="j"), Entry(b"low", 0, job="j")], {})
    leases = queue.lease(10)
    client.set(keys.level(0), "not a list")  # where "low" goes back; "high" comes first
    with pytest.raises(redis.ResponseError, match="WRONGTYPE damaged key") as refused:
        queue.release([lease.member for lease in leases])
    assert client.zcard(keys.inflight) == 2 and len(queue) == 0  # nothing half-done
    assert not repair(client, keys)  # no index names the list any more: only the refusal does
    assert Repairer(client, keys).after(refused.value) == Repair(moved=[keys.level(0)])
    assert queue.release([lease.member for lease in leases]) == 2
    assert sorted(lease.payload for lease in queue.lease(10)) == [b"high", b"low"]


def test_a_closing_scheduler_hands_its_leases_back_past_a_damaged_list(
    make_crawler: Any, client: redis.Redis
) -> None:
    scheduler = open_scheduler(make_crawler(SCHEDULER_PERSIST=True))
    keys = scheduler.queue.keys
    for url in ("http://127.0.0.1/a", "http://127.0.0.1/b"):
        scheduler.enqueue_request(Request(url))
    scheduler.flush()
    assert scheduler.next_request() is not None  # both leased, one held back in the prefetch
    client.set(keys.level(0), "not a list")
    scheduler.close("finished")
    assert client.get(keys.level(0) + "~damaged") == b"not a list"
    assert client.zcard(keys.inflight) == 0 and len(scheduler.queue) == 2


def test_the_engines_idle_check_meets_a_damaged_list_stays_open_and_repairs(
    make_crawler: Any, client: redis.Redis
) -> None:
    """Scrapy asks has_pending_requests() from its own loop: a refusal must not get there."""
    scheduler = open_scheduler(make_crawler(SCHEDULER_PERSIST=True))
    keys = scheduler.queue.keys
    client.zadd(keys.queue, {"3": -3})
    client.set(keys.level(3), "not a list")
    assert scheduler.has_pending_requests()  # cannot tell: stays open
    assert client.exists(keys.level(3) + "~damaged")
    assert len(scheduler) == 0
    scheduler.close("finished")


def test_joining_a_job_whose_hash_has_the_wrong_type_finds_no_job(
    client: redis.Redis, prefix: str
) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    client.set(queue.keys.job("j"), "not a hash")
    assert queue.job_store.join("j", "s1") == ("", "", "")


def test_entries_of_a_job_hash_of_the_wrong_type_are_dead_lettered(
    client: redis.Redis, prefix: str
) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    keys = queue.keys
    queue.start_job("gone", [Entry(b"a", job="gone")], {})
    queue.start_job("j", [Entry(b"b", job="j")], {})
    client.delete(keys.job("gone"))
    client.set(keys.job("gone"), "not a hash")
    assert [lease.payload for lease in queue.lease(10)] == [b"b"]
    assert client.llen(keys.deadletter) == 1 and len(queue) == 0


def test_a_damaged_damage_counter_still_lets_stats_through(
    client: redis.Redis, prefix: str
) -> None:
    """The soak's other find: the stats flush failed every time, forever."""
    from celery_crawl.core import scripts

    keys = SpiderKeys.build("r", prefix=prefix)
    client.hset(keys.stats, mapping={"pages": "x", "celery_crawl/damaged/stats": "y"})
    update = scripts.script(client, "stats_update")
    written = keys.stats_written("w")
    update(keys=[keys.stats, keys.stats_types, written], args=["", 0, "incr", "pages", "2", "i"])
    assert client.hget(keys.stats, "pages") == b"2"
    assert client.hget(keys.stats, "celery_crawl/damaged/stats") == b"1"


def test_a_job_counter_damaged_mid_crawl_closes_the_job_at_the_next_ack(
    client: redis.Redis, prefix: str
) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    keys = queue.keys
    queue.start_job("j", [Entry(b"a", job="j"), Entry(b"b", job="j")], {})
    leases = queue.lease(1)
    client.hset(keys.job("j"), "done", "text")
    assert queue.ack([lease.member for lease in leases]) == 1  # no error
    job = client.hgetall(keys.job("j"))
    assert job[b"state"] == b"closed" and job[b"reason"] == b"damaged: done"


def _forum_group(client: redis.Redis, prefix: str) -> tuple[PriorityQueue, PriorityQueue]:
    """The forum example's group: ``forum`` routes its detail pages to ``forum_detail``."""
    scope = {"dedup_scope": "spider"}  # as the forum spider sets it
    forum = PriorityQueue(client, SpiderKeys.build("forum", prefix=prefix), **scope)
    keys = SpiderKeys.build("forum_detail", group="forum", prefix=prefix)
    return forum, PriorityQueue(client, keys, **scope)


def _dump(client: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every key of the test, with its serialized value: what a refused call must not change."""
    return {key: client.dump(key) for key in client.scan_iter(match=f"{prefix}*")}


def _damage(client: redis.Redis, forum: SpiderKeys, detail: SpiderKeys, kind: str) -> str:
    """Damage one key kind; returns the key a refusal must name."""
    if kind.startswith("detail_"):
        keys, kind = detail, kind.removeprefix("detail_")
    else:
        keys = forum
    key = {
        "dedup_count": keys.dupefilter_count,
        "dedup_bucket": f"{keys.dupefilter}:0:0",
        "levels": keys.queue,
        "level": keys.level(0),
        "signal": keys.signal,
        "inflight": keys.inflight,
        "deadletter": keys.deadletter,
        "active": keys.active_jobs,
    }[kind]
    if kind == "dedup_count":
        client.set(key, "abc")  # the case: a counter that holds text
    else:
        client.delete(key)
        client.hset(key, "x", "not of its type")
    return key


ROUTED_DAMAGE = [
    "detail_dedup_count",
    "detail_dedup_bucket",
    "detail_levels",
    "detail_level",
    "detail_signal",
    "dedup_count",
    "levels",
    "level",
    "inflight",
    "deadletter",
    "active",
]


@pytest.mark.parametrize("kind", ROUTED_DAMAGE)
def test_a_routed_enqueue_meeting_a_damaged_key_writes_nothing_and_repair_lets_it_through(
    client: redis.Redis, prefix: str, kind: str
) -> None:
    """Issue 28: the routed spider's dedup count set to text made enqueue.lua throw after it
    had pushed the dont_filter children, so every retry pushed them again."""
    forum, detail = _forum_group(client, prefix)
    forum.start_job("j", [Entry(b"seed", job="j")], {})
    (seed,) = forum.lease(1)
    key = _damage(client, forum.keys, detail.keys, kind)
    own = [Entry(b"next", fingerprint=b"\x01" * 20, job="j"), Entry(b"again", job="j")]
    routed = [Entry(b"post", fingerprint=b"\x00" * 20, job="j"), Entry(b"dont", job="j")]
    call: Any = {"acks": [seed.member], "routed": [(detail, routed)], "call": ("w", 1)}
    call["dead_letters"] = ['{"reason": "a child that could not be queued"}']
    before = _dump(client, prefix)
    with pytest.raises(redis.ResponseError, match=f"WRONGTYPE damaged key {key}:") as refused:
        forum.push_many(own, **call)
    assert _dump(client, prefix) == before  # refused whole: nothing written
    group = [forum.keys, detail.keys]
    done = Repairer(client, forum.keys, group).after(refused.value)
    assert done is not None and done.moved == [key]
    owner = detail.keys if kind.startswith("detail_") else forum.keys
    assert int(client.hget(owner.stats, DAMAGED) or 0) == 1  # counted with its spider
    assert forum.push_many(own, **call) == [True] * 4
    assert len(forum) == 2 and len(detail) == 2 and client.zcard(forum.keys.inflight) == 0
    forgotten = kind == "inflight"  # its seed's lease went with the set: that ack is skipped
    assert client.hget(forum.keys.job("j"), "pending") == (b"5" if forgotten else b"4")
    assert client.llen(forum.keys.deadletter) == 1


def _job_with_lease(client: redis.Redis, prefix: str) -> tuple[PriorityQueue, bytes]:
    forum, _ = _forum_group(client, prefix)
    forum.start_job("j", [Entry(b"a", job="j"), Entry(b"b", job="j")], {})
    forum.job_store.join("j", "s1")
    (lease,) = forum.lease(1)
    return forum, lease.member


def _job_start_raw(queue: PriorityQueue, _: bytes) -> Any:
    """The job start script alone (``Base.start_job`` repairs and sends it again itself)."""
    from celery_crawl.core import scripts
    from celery_crawl.jobs.store import START

    args = START.build(job_id="k", seed_requests=1, job_fields=0, dedup_scope=queue.dedup_scope)
    args += Entry(b"c", fingerprint=b"\x02" * 20, job="k").args(queue.uses_priority)
    call = scripts.script(queue.client, START.script, dupefilter=queue.dedup.lua)
    return call(keys=queue._push_keys(), args=[*args, *queue.dedup.params])


# (what the call does, the key kind damaged): each script on its own keys
SCRIPT_DAMAGE = {
    "ack: in-flight set": (lambda q, m: q.ack([m]), lambda k: k.inflight),
    "ack: job index": (lambda q, m: q.ack([m]), lambda k: k.active_jobs),
    "ack: job done list": (lambda q, m: q.ack([m]), lambda k: k.job("j") + ":done"),
    "dead_letter: list": (lambda q, m: q.dead_letter(m, "{}", "codec"), lambda k: k.deadletter),
    "renew: in-flight set": (lambda q, m: q.renew([m]), lambda k: k.inflight),
    "job_end: participants": (
        lambda q, m: q.job_store.end("j", "test"),
        lambda k: k.job_participants("j"),
    ),
    "job_leave: done list": (
        lambda q, m: q.job_store.leave("j", "s1"),
        lambda k: k.job("j") + ":done",
    ),
    "job_start: dedup count": (_job_start_raw, lambda k: k.dupefilter_count),
}


def test_a_job_start_meeting_a_damaged_key_is_repaired_and_sent_again(
    client: redis.Redis, prefix: str
) -> None:
    queue, _ = _job_with_lease(client, prefix)
    client.delete(queue.keys.dupefilter_count)
    client.set(queue.keys.dupefilter_count, "abc")
    created, accepted = queue.start_job("k", [Entry(b"c", fingerprint=b"\x02" * 20, job="k")], {})
    assert created and accepted == 1
    assert client.get(queue.keys.dupefilter_count + "~damaged") == b"abc"


@pytest.mark.parametrize("case", sorted(SCRIPT_DAMAGE))
def test_a_script_meeting_a_damaged_key_writes_nothing_and_runs_after_repair(
    client: redis.Redis, prefix: str, case: str
) -> None:
    queue, member = _job_with_lease(client, prefix)
    call, damaged = SCRIPT_DAMAGE[case]
    key = damaged(queue.keys)
    client.delete(key)
    client.set(key, "abc")  # a string where a hash, list, set or zset belongs; text for a count
    before = _dump(client, prefix)
    with pytest.raises(redis.ResponseError, match=f"WRONGTYPE damaged key {key}:") as refused:
        call(queue, member)
    assert _dump(client, prefix) == before
    done = Repairer(client, queue.keys).after(refused.value)
    assert done is not None and key in done.moved
    call(queue, member)  # goes through


def test_a_text_counter_in_a_job_never_fails_its_end(client: redis.Redis, prefix: str) -> None:
    """job_outcome compared tonumber(text) with 0, after the ack had written."""
    queue = PriorityQueue(client, SpiderKeys.build("r", prefix=prefix))
    queue.start_job("j", [Entry(b"a", job="j")], {"limit/pages": "many"})
    client.hset(queue.keys.job("j"), mapping={"lost": "x", "dropped": "y", "errors/x": "z"})
    (lease,) = queue.lease(1)
    assert queue.push_many([], acks=[lease.member], job_stats=[("j", "pages", 1)]) == []
    assert client.hget(queue.keys.job("j"), "state") == b"done"


# Issue 28, the scripts audited second: each call refused whole (its keys compared before
# and after), then the Python caller's repair (celery_crawl.core.repair.retried) lets it through.


def _wrong_type(client: redis.Redis, key: str) -> None:
    client.delete(key)
    client.hset(key, "x", "not of its type")


def _routed_job(client: redis.Redis, prefix: str) -> tuple[PriorityQueue, PriorityQueue]:
    """Job ``j`` of the forum group: a seed queued with ``forum``, a post with ``forum_detail``."""
    forum, detail = _forum_group(client, prefix)
    forum.start_job("j", [Entry(b"seed", job="j"), Entry(b"next", job="j")], {})
    (seed,) = forum.lease(1)
    routed = [Entry(b"post", fingerprint=b"\x00" * 20, job="j")]
    forum.push_many([], acks=[seed.member], routed=[(detail, routed)])
    return forum, detail


def _cancel_raw(client: redis.Redis, forum: SpiderKeys, detail: SpiderKeys) -> Any:
    from celery_crawl.core import scripts

    keys = [forum.job_prefix, forum.site_prefix]
    for spider in (forum, detail):
        keys += [spider.queue, spider.dupefilter, spider.dupefilter_count]
    return scripts.script(client, "job_cancel", dupefilter="dedup_exact")(keys=keys, args=["j"])


def _cancel(client: redis.Redis, forum: SpiderKeys, detail: SpiderKeys) -> int:
    from celery_crawl.jobs.handle import Job

    return Job("j", "forum", client, forum, [forum, detail]).cancel()


def case_cancel_routed_index(client: redis.Redis, prefix: str) -> Any:
    """The forum's lists are purged first; the routed spider's index was met after."""
    forum, detail = _routed_job(client, prefix)
    _wrong_type(client, detail.keys.queue)
    raw = lambda: _cancel_raw(client, forum.keys, detail.keys)  # noqa: E731
    return raw, lambda: _cancel(client, forum.keys, detail.keys) == 1, detail.keys.queue


def case_cancel_routed_dedup_count(client: redis.Redis, prefix: str) -> Any:
    """The purged post's fingerprint leaves a filter whose count holds text."""
    forum, detail = _routed_job(client, prefix)
    client.set(detail.keys.dupefilter_count, "abc")
    raw = lambda: _cancel_raw(client, forum.keys, detail.keys)  # noqa: E731
    return raw, lambda: _cancel(client, forum.keys, detail.keys) == 2, detail.keys.dupefilter_count


def _producer(client: redis.Redis, prefix: str) -> Any:
    from celery_crawl.producer.producer import Producer

    forum, detail = _forum_group(client, prefix)
    producer = Producer(client, forum.keys, job_cap=5, group=[forum.keys, detail.keys])
    client.hset(forum.keys.producer_running, "gone", "nojob|1")  # stale: forgotten first
    started: list[str] = []
    tick = lambda: producer.tick(["a"], lambda s, j: started.append(s)) and started == ["a"]  # noqa: E731
    return producer, forum, detail, tick


def case_produce_cursor(client: redis.Redis, prefix: str) -> Any:
    producer, forum, _, tick = _producer(client, prefix)
    _wrong_type(client, forum.keys.producer_cursor)
    return lambda: producer.reserve(["a"]), tick, forum.keys.producer_cursor


def case_produce_routed_level(client: redis.Redis, prefix: str) -> Any:
    producer, _, detail, tick = _producer(client, prefix)
    client.zadd(detail.keys.queue, {"0": 0})
    _wrong_type(client, detail.keys.level(0))
    return lambda: producer.reserve(["a"]), tick, detail.keys.level(0)


def case_scheduler_leave_index(client: redis.Redis, prefix: str) -> Any:
    forum, _ = _routed_job(client, prefix)
    forum.register("s1", 60)
    _wrong_type(client, forum.keys.queue)
    leave = lambda: forum.unregister("s1", clear=True)  # noqa: E731
    return leave, lambda: retried(Repairer(client, forum.keys), leave)[0] == 0, forum.keys.queue


def case_queue_clear_parked(client: redis.Redis, prefix: str) -> Any:
    forum, _ = _routed_job(client, prefix)
    _wrong_type(client, forum.keys.parked)
    clear = forum.clear
    return clear, lambda: retried(Repairer(client, forum.keys), clear) is None, forum.keys.parked


def case_scheduler_join(client: redis.Redis, prefix: str) -> Any:
    forum, _ = _forum_group(client, prefix)
    _wrong_type(client, forum.keys.open_schedulers)
    join = lambda: forum.register("s1", 60)  # noqa: E731
    return (
        join,
        lambda: retried(Repairer(client, forum.keys), join) == 1,
        forum.keys.open_schedulers,
    )


def _filter(client: redis.Redis, prefix: str, kind: str) -> Any:
    from celery_crawl.dupefilter.filters import KINDS

    df = KINDS[kind].filter(client, SpiderKeys.build("r", prefix=prefix), None)
    assert df.add_fingerprints([b"\x00" * 20]) == [True]  # the filter exists
    return df


def _add_raw(client: redis.Redis, df: Any, fps: list[bytes]) -> Any:
    from celery_crawl.core import scripts

    keys = [df.keys.dupefilter, df.keys.dupefilter_count]
    args = ["add", len(fps), *fps, *df.script.params]
    return scripts.script(client, "dedup", dupefilter=df.lua)(keys=keys, args=args)


FRESH = [b"\x01" * 20, b"\xff" * 20]  # buckets 0 and 127 of generation 0


def case_dedup_add_bucket(client: redis.Redis, prefix: str) -> Any:
    """The first fingerprint was added before the second's bucket was met."""
    df = _filter(client, prefix, "exact")
    key = f"{df.keys.dupefilter}:0:127"
    client.set(key, "not a set")
    return lambda: _add_raw(client, df, FRESH), lambda: df.add_fingerprints(FRESH) == [1, 1], key


def case_dedup_bloom_parameters(client: redis.Redis, prefix: str) -> Any:
    df = _filter(client, prefix, "bloom")
    key = df.keys.dupefilter + ":bloom"
    client.hset(key, "bits:0", "many")
    return lambda: _add_raw(client, df, FRESH), lambda: df.add_fingerprints(FRESH) == [1, 1], key


def case_dedup_expiring_geometry(client: redis.Redis, prefix: str) -> Any:
    df = _filter(client, prefix, "expiring")
    key = df.keys.dupefilter + ":expiring"
    client.hset(key, "width_ms", "wide")
    return lambda: _add_raw(client, df, FRESH), lambda: df.add_fingerprints(FRESH) == [1, 1], key


def case_site_feedback_known(client: redis.Redis, prefix: str) -> Any:
    """A back-off wrote the site's hash before it met the set of known sites."""
    from celery_crawl.core import scripts
    from celery_crawl.politeness.sites import SiteState, mode_arguments

    forum, _ = _forum_group(client, prefix)
    state, keys = SiteState(client, forum.keys), forum.keys
    _wrong_type(client, keys.site_known)
    site_keys = [keys.site("a.test"), keys.site_known, keys.site_leases("a.test")]
    args = ["a.test", "backoff", 1000, *mode_arguments("backoff", state.policy.backoff.args(None))]
    raw = lambda: scripts.script(client, "site_feedback")(keys=site_keys, args=args)  # noqa: E731
    return raw, lambda: state.backoff("a.test", None) > 0, keys.site_known


def case_cookies_write_jar(client: redis.Redis, prefix: str) -> Any:
    from celery_crawl.cookies.store import CookieStore

    forum, _ = _forum_group(client, prefix)
    key, store = forum.keys.cookie_jar("", "0"), CookieStore(client, 60)
    client.rpush(key, "not a hash")
    write = lambda: store.write(key, {"a.test|/|n": "{}"})  # noqa: E731
    return write, lambda: retried(Repairer(client, forum.keys), write)[1] == 0, key


def case_job_reconcile_participants(client: redis.Redis, prefix: str) -> Any:
    """A job whose state is garbled ends closed: its participants were met after that write."""
    from celery_crawl.core import scripts

    forum, detail = _forum_group(client, prefix)
    forum.start_job("j", [Entry(b"seed", job="j")], {})
    forum.job_store.join("j", "s1")
    client.hset(forum.keys.job("j"), "state", "garbled")
    client.delete(forum.keys.queue)
    participants = forum.keys.job_participants("j")
    client.delete(participants)
    client.set(participants, "not a hash")
    keys = [forum.keys.job_prefix]
    for spider in (forum.keys, detail.keys):
        keys += [spider.queue, spider.parked, spider.inflight]
    raw = lambda: scripts.script(client, "job_reconcile")(keys=keys, args=[0])  # noqa: E731
    group = [forum.keys, detail.keys]
    return raw, lambda: end_lost_jobs(client, group, grace_seconds=0) == ["j"], participants


def case_worker_beat_registry(client: redis.Redis, prefix: str) -> Any:
    from celery_crawl.core.keys import workers_key
    from celery_crawl.hosting.registry import WorkerRegistration

    forum, _ = _forum_group(client, prefix)
    key = workers_key(prefix)
    _wrong_type(client, key)
    plain = WorkerRegistration(
        client, key, ["forum"]
    )  # no repairer: the refusal reaches the caller
    hosted = WorkerRegistration(client, key, ["forum"], repairer=Repairer(client, forum.keys))
    return plain.renew, lambda: hosted.renew() is None and client.zcard(key) == 1, key


AUDITED = {
    "job_cancel: routed spider's queue index": case_cancel_routed_index,
    "job_cancel: routed spider's dedup count": case_cancel_routed_dedup_count,
    "produce: cursor": case_produce_cursor,
    "produce: routed spider's level list": case_produce_routed_level,
    "scheduler_leave: queue index": case_scheduler_leave_index,
    "queue_clear: parked index": case_queue_clear_parked,
    "scheduler_join: open schedulers": case_scheduler_join,
    "dedup add: a bucket": case_dedup_add_bucket,
    "dedup add: bloom parameters": case_dedup_bloom_parameters,
    "dedup add: expiring geometry": case_dedup_expiring_geometry,
    "site_feedback: known sites": case_site_feedback_known,
    "cookies_write: jar": case_cookies_write_jar,
    "job_reconcile: participants": case_job_reconcile_participants,
    "worker_beat: registry": case_worker_beat_registry,
}


@pytest.mark.parametrize("case", sorted(AUDITED))
def test_an_audited_script_meeting_a_damaged_key_writes_nothing_and_its_caller_repairs(
    client: redis.Redis, prefix: str, case: str
) -> None:
    raw, repaired, key = AUDITED[case](client, prefix)
    before = _dump(client, prefix)
    with pytest.raises(redis.ResponseError, match=f"WRONGTYPE damaged key {key}:"):
        raw()
    assert _dump(client, prefix) == before  # refused whole: nothing written
    assert repaired()  # the caller moved the key aside and sent the call again
    assert client.exists(key + "~damaged")
    spider = "forum_detail" if "routed" in case else ("r" if "dedup add" in case else "forum")
    owner = SpiderKeys.build(spider, group="forum" if "routed" in case else None, prefix=prefix)
    assert int(client.hget(owner.stats, DAMAGED) or 0) == 1  # counted with its spider


def test_a_counter_of_text_never_fails_a_cancel_half_way(client: redis.Redis, prefix: str) -> None:
    forum, detail = _routed_job(client, prefix)
    client.hset(forum.keys.job("j"), "pending", "x")
    assert _cancel(client, forum.keys, detail.keys) == 2
    job = client.hgetall(forum.keys.job("j"))
    assert job[b"state"] == b"cancelled" and job[b"pending~damaged"] == b"x"
    assert len(forum) == len(detail) == 0


def test_a_site_count_of_text_never_fails_a_backoff_half_way(
    client: redis.Redis, prefix: str
) -> None:
    from celery_crawl.politeness.sites import SiteState

    keys = SpiderKeys.build("r", prefix=prefix)
    client.hset(keys.site("a.test"), mapping={"backoffs": "x", "paused_ms": "y"})
    assert SiteState(client, keys).backoff("a.test", None) > 0
    site = client.hgetall(keys.site("a.test"))
    assert site[b"backoffs"] == b"1" and site[b"backoffs~damaged"] == b"x"
    assert client.sismember(keys.site_known, "a.test")


def test_a_cookie_jar_version_of_text_never_fails_a_write_half_way(
    client: redis.Redis, prefix: str
) -> None:
    from celery_crawl.cookies.store import CookieStore

    key = SpiderKeys.build("r", prefix=prefix).cookie_jar("", "0")
    client.hset(key, "~version", "garbled")
    new, previous = CookieStore(client, 60).write(key, {"a.test|/|n": "{}"})
    assert previous == 0 and new > 0
    assert client.hget(key, "~version") == str(new).encode()


def test_a_reserved_job_of_another_type_is_forgotten_by_the_producer(
    client: redis.Redis, prefix: str
) -> None:
    from celery_crawl.producer.producer import Producer

    keys = SpiderKeys.build("r", prefix=prefix)
    client.hset(keys.producer_running, mapping={"gone": "nojob|1", "odd": "odd|1"})
    client.set(keys.job("odd"), "not a hash")
    assert [source for source, _ in Producer(client, keys, job_cap=5).reserve(["a"]).produced] == [
        "a"
    ]
    assert client.hkeys(keys.producer_running) == [b"a"]


def test_the_exporters_size_names_an_expiring_geometry_that_is_not_numbers(
    client: redis.Redis, prefix: str
) -> None:
    """spider_size.lua takes no parameters: a width of text fell back on none, and threw."""
    from celery_crawl.core import scripts

    df = _filter(client, prefix, "expiring")
    key = df.keys.dupefilter + ":expiring"
    client.hset(key, "width_ms", "wide")
    size = scripts.script(client, "spider_size")
    keys = [df.keys.queue, df.keys.dupefilter, df.keys.dupefilter_count]
    with pytest.raises(redis.ResponseError, match=f"WRONGTYPE damaged key {key}:"):
        size(keys=keys)
    assert repair(client, df.keys).moved == [key]
    assert size(keys=keys) == [0, 0]  # no geometry until the next add: read as no filter
    assert df.add_fingerprints([b"\x01" * 20]) == [True]
    assert size(keys=keys) == [0, 2]  # the geometry again: both live fingerprints counted


def test_a_lease_stops_before_a_site_whose_keys_are_damaged_then_refuses_it_whole(
    client: redis.Redis, prefix: str
) -> None:
    """The site of an entry below the top level was first met after its pop: its hash of
    another type failed the lease, and every entry it had popped was lost."""
    from celery_crawl.politeness.sites import SitePolicy

    keys = SpiderKeys.build("r", prefix=prefix)
    queue = PriorityQueue(client, keys, sites=SitePolicy())
    entries = [Entry(b"plain", 9, job="j"), Entry(b"sited", 0, job="j", site="b.test")]
    queue.start_job("j", entries, {})
    client.set(keys.site("b.test"), "not a hash")
    assert [lease.payload for lease in queue.lease(10)] == [b"plain"]  # stopped before it
    before = _dump(client, prefix)
    with pytest.raises(redis.ResponseError, match=f"damaged key {keys.site('b.test')}:") as refused:
        queue.lease(10)  # now on top: checked before anything is written
    assert _dump(client, prefix) == before
    assert Repairer(client, keys).after(refused.value) == Repair(moved=[keys.site("b.test")])
    assert [lease.payload for lease in queue.lease(10)] == [b"sited"]


def test_a_request_whose_site_keys_are_damaged_passes_the_gate_while_they_are_repaired(
    client: redis.Redis, prefix: str
) -> None:
    """The gate's refusal reached Scrapy's downloader: the request failed."""
    import asyncio

    from celery_crawl.politeness.middleware import SiteLimitsMiddleware
    from celery_crawl.politeness.sites import SiteState

    keys = SpiderKeys.build("r", prefix=prefix)
    client.set(keys.site("a.test"), "not a hash")
    client.set(keys.site_known, "not a set")
    middleware = SiteLimitsMiddleware(SiteState(client, keys))
    for _ in range(2):  # the second key is refused after the first's repair: not retried
        assert asyncio.run(middleware.process_request(Request("http://a.test/"))) is None
    assert client.exists(keys.site("a.test") + "~damaged")


def test_the_last_scheduler_closing_past_a_damaged_index_leaves_and_clears(
    make_crawler: Any, client: redis.Redis
) -> None:
    """scheduler_leave left the open schedulers, then met the index: close raised, the
    queue stayed, and the crawl's hash with it."""
    scheduler = open_scheduler(make_crawler(SCHEDULER_PERSIST=False))
    keys = scheduler.queue.keys
    scheduler.enqueue_request(Request("http://127.0.0.1/a"))
    scheduler.flush()
    client.set(keys.queue, "not a sorted set")
    scheduler.close("finished")
    assert client.exists(keys.queue + "~damaged")
    assert client.exists(keys.open_schedulers, keys.crawl, keys.queue) == 0
