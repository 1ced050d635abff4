"""Contract tests, run against every queue class, on a real server."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from celery_crawl.core.entries import Entry
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.queue.leases import LeaseTimes
from celery_crawl.queue.queues import Base, FifoQueue, LifoPriorityQueue, LifoQueue, PriorityQueue
from tests.support.ports import free_port, started_valkey

QUEUE_CLASSES = [PriorityQueue, FifoQueue, LifoQueue, LifoPriorityQueue]


@pytest.fixture(params=QUEUE_CLASSES, ids=lambda cls: cls.__name__)
def queue(request: pytest.FixtureRequest, client: redis.Redis, prefix: str) -> Base:
    cls: type[Base] = request.param
    return cls(client, SpiderKeys.build("forum", prefix=prefix), lease_seconds=60)


def payloads(leases: list) -> list[bytes]:
    return [lease.payload for lease in leases]


def test_push_then_pop_returns_every_entry_once(queue: Base) -> None:
    queue.push_many([Entry(f"r{i}".encode()) for i in range(50)])
    assert len(queue) == 50
    popped = payloads(queue.pop(count=100))
    assert sorted(popped) == sorted(f"r{i}".encode() for i in range(50))
    assert len(queue) == 0
    assert queue.pop() == []


def test_identical_payloads_never_merge(queue: Base) -> None:
    queue.push_many([Entry(b"same"), Entry(b"same"), Entry(b"same")])
    assert len(queue) == 3
    leases = queue.pop(count=3)
    assert payloads(leases) == [b"same"] * 3
    assert len({lease.member for lease in leases}) == 3
    assert queue.in_flight() == 3


@pytest.mark.alone  # a wait timed within bounds
def test_pop_honours_its_timeout_when_empty(queue: Base) -> None:
    started = time.monotonic()
    assert queue.pop(timeout=0.3) == []
    waited = time.monotonic() - started
    assert 0.25 <= waited < 2.0


@pytest.mark.alone  # woken within bounds
def test_blocked_pop_wakes_on_push(queue: Base, client: redis.Redis) -> None:
    import threading

    threading.Timer(0.2, lambda: queue.push(b"late")).start()
    started = time.monotonic()
    leases = queue.pop(timeout=5)
    assert payloads(leases) == [b"late"]
    assert time.monotonic() - started < 2.0


def test_pop_leases_instead_of_deleting(queue: Base) -> None:
    queue.push(b"a")
    (lease,) = queue.pop()
    assert len(queue) == 0
    assert queue.in_flight() == 1
    assert queue.ack([lease.member]) == 1
    assert queue.in_flight() == 0
    assert queue.ack([lease.member]) == 0


def test_expired_leases_are_requeued(queue: Base) -> None:
    queue.leases = LeaseTimes(0.5)
    queue.push_many([Entry(b"a"), Entry(b"b")])
    leases = queue.pop(count=2)
    assert queue.requeue_expired() == 0
    time.sleep(0.6)
    assert queue.requeue_expired() == 2
    assert queue.in_flight() == 0
    assert sorted(payloads(queue.pop(count=2))) == [b"a", b"b"]
    assert queue.ack([lease.member for lease in leases]) == 0


def test_acked_lease_is_not_requeued(queue: Base) -> None:
    queue.leases = LeaseTimes(0.05)
    queue.push(b"a")
    (lease,) = queue.pop()
    queue.ack([lease.member])
    time.sleep(0.1)
    assert queue.requeue_expired() == 0
    assert len(queue) == 0


def test_extend_keeps_a_lease_alive(queue: Base) -> None:
    queue.leases = LeaseTimes(0.2)
    queue.push(b"a")
    (lease,) = queue.pop()
    time.sleep(0.1)
    assert queue.renew([lease.member], seconds=5) == 1
    time.sleep(0.2)
    assert queue.requeue_expired() == 0
    assert queue.in_flight() == 1


def test_release_hands_back_at_once(queue: Base) -> None:
    queue.push_many([Entry(b"a"), Entry(b"b")])
    leases = queue.pop(count=2)
    assert queue.release([lease.member for lease in leases]) == 2
    assert len(queue) == 2
    assert queue.in_flight() == 0
    assert queue.release([lease.member for lease in leases]) == 0


def test_dedup_and_dont_filter(queue: Base) -> None:
    flags = queue.push_many(
        [Entry(b"1", fingerprint=b"f" * 20), Entry(b"2", fingerprint=b"f" * 20), Entry(b"3")]
    )
    assert flags == [True, False, True]
    assert queue.push_many([Entry(b"4")]) == [True]
    assert len(queue) == 3


def test_ack_in_the_same_step_as_children(queue: Base) -> None:
    queue.push(b"parent")
    (lease,) = queue.pop()
    assert queue.push_many([Entry(b"child")], acks=[lease.member]) == [True]
    assert queue.in_flight() == 0
    assert payloads(queue.pop()) == [b"child"]


def test_clear_removes_everything(queue: Base, client: redis.Redis, prefix: str) -> None:
    queue.push_many([Entry(b"a", priority=3), Entry(b"b", priority=-1)])
    queue.pop()
    queue.clear()
    assert len(queue) == 0
    assert queue.in_flight() == 0
    assert list(client.scan_iter(match=f"{prefix}:*queue*")) == []


def test_priority_order_and_fifo_within_a_priority(client: redis.Redis, prefix: str) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("forum", prefix=prefix))
    entries = [Entry(f"p{p}-{i}".encode(), priority=p) for i in range(5) for p in (0, 10, -5, 3)]
    queue.push_many(entries)
    popped = [p.decode() for p in payloads(queue.pop(count=100))]
    expected = [f"p{p}-{i}" for p in (10, 3, 0, -5) for i in range(5)]
    assert popped == expected


def test_requeued_lease_goes_back_to_the_front_of_its_level(
    client: redis.Redis, prefix: str
) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("forum", prefix=prefix), lease_seconds=60)
    queue.push_many([Entry(b"first", priority=1), Entry(b"second", priority=1)])
    (lease,) = queue.pop()
    queue.push(b"low", priority=0)
    queue.release([lease.member])
    assert payloads(queue.pop(count=3)) == [b"first", b"second", b"low"]


def test_fifo_and_lifo_order(client: redis.Redis, prefix: str) -> None:
    keys = SpiderKeys.build("forum", prefix=prefix)
    fifo = FifoQueue(client, keys)
    fifo.push_many([Entry(b"1", priority=5), Entry(b"2", priority=9), Entry(b"3")])
    assert payloads(fifo.pop(count=3)) == [b"1", b"2", b"3"]
    lifo = LifoQueue(client, SpiderKeys.build("other", prefix=prefix))
    lifo.push_many([Entry(b"1"), Entry(b"2"), Entry(b"3")])
    assert payloads(lifo.pop(count=3)) == [b"3", b"2", b"1"]


def test_lifo_within_a_priority_and_priorities_honoured_as_scrapy_does(
    client: redis.Redis, prefix: str
) -> None:
    queue = LifoPriorityQueue(client, SpiderKeys.build("forum", prefix=prefix), lease_seconds=60)
    queue.push_many([Entry(b"a"), Entry(b"b"), Entry(b"c", priority=5), Entry(b"d")])
    queue.push_many([Entry(b"e", priority=5), Entry(b"low", priority=-1)])
    (first,) = queue.pop()
    assert first.payload == b"e"
    queue.release([first.member])  # handed back: taken first again
    assert payloads(queue.pop(count=2)) == [b"e", b"c"]
    queue.push(b"f")
    assert payloads(queue.pop(count=10)) == [b"f", b"d", b"b", b"a", b"low"]


def test_lease_carries_its_priority(client: redis.Redis, prefix: str) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("forum", prefix=prefix))
    queue.push(b"x", priority=-7)
    (lease,) = queue.pop()
    assert lease.priority == -7
    assert lease.payload == b"x"


def test_pending_counts_queued_and_leased_in_one_call(queue: Base) -> None:
    assert queue.pending() == (0, 0)
    queue.push_many([Entry(b"a"), Entry(b"b", 3), Entry(b"c")])
    (lease,) = queue.lease(1)
    assert queue.pending() == (2, 1)
    queue.lease(5)
    assert queue.pending() == (0, 3)  # the queue is empty, but work may still come
    queue.ack([lease.member])
    assert queue.pending() == (0, 2)


def test_dead_letters_are_kept_newest_first_up_to_the_limit(queue: Base) -> None:
    queue.deadletter_max = 3
    records = [f'{{"n": {i}}}' for i in range(5)]
    assert queue.push_many([Entry(b"ok")], dead_letters=records[:2]) == [True]
    assert queue.push_many([], dead_letters=records[2:]) == []
    kept = queue.client.lrange(queue.keys.deadletter, 0, -1)
    assert kept == [r.encode() for r in reversed(records[2:])]
    assert len(queue) == 1


def test_the_last_scheduler_to_leave_clears_queue_and_dedup(queue: Base) -> None:
    client, keys = queue.client, queue.keys
    assert queue.register("a", 60) == 1
    assert queue.register("b", 60) == 2
    assert queue.register("a", 60) == 2  # a renewal, not a third
    queue.push_many([Entry(b"x", fingerprint=b"f" * 20), Entry(b"y", 2, b"g" * 20)])
    assert queue.unregister("a", clear=True) == (1, 0)  # b still has them open
    assert len(queue) == 2 and client.exists(keys.dupefilter_count)
    assert queue.unregister("b", clear=True)[0] == 0
    assert len(queue) == 0
    assert not client.keys(f"{keys.queue}*") and not client.keys(f"{keys.dupefilter}*")


def test_leaving_without_clear_keeps_the_state(queue: Base) -> None:
    queue.register("a", 60)
    queue.push_many([Entry(b"x", fingerprint=b"f" * 20)])
    assert queue.unregister("a", clear=False) == (0, 0)
    assert len(queue) == 1
    assert not queue.client.exists(queue.keys.open_schedulers)


def test_a_registration_not_renewed_stops_counting(queue: Base) -> None:
    """A killed process never blocks the clear for good: its registration runs out."""
    queue.register("killed", 0.05)
    queue.register("alive", 60)
    queue.push_many([Entry(b"x")])
    time.sleep(0.1)
    assert queue.unregister("alive", clear=True)[0] == 0
    assert len(queue) == 0
    queue.register("short", 0.05)
    time.sleep(0.1)
    assert not queue.client.exists(queue.keys.open_schedulers)  # the key expires too


def job_counts(client: redis.Redis, queue: Base, job: str) -> dict[str, str]:
    raw = client.hgetall(queue.keys.job(job))
    return {k.decode(): v.decode() for k, v in raw.items()}


def test_stats_of_an_ended_job_are_kept_apart_as_late(queue: Base, client: redis.Redis) -> None:
    queue.start_job("j", [Entry(b"seed", job="j")], {"spider": "forum"})
    (lease,) = queue.pop()
    # the worker that finishes the job: its stats, then its ack, in one call
    stats = [("j", "pages", 1), ("j", "items", 3)]
    queue.push_many([], acks=[lease.member], job_stats=stats, participant="finisher")
    ended = job_counts(client, queue, "j")
    assert ended["state"] == "done"
    # a worker cut off while it held the same page comes back, no longer a participant
    # (its registration lapsed): its stats, its old ack and a child, of a job that has ended
    late_stats = [("j", "pages", 4), ("j", "items", 120), ("j", "status/200", 4)]
    flags = queue.push_many(
        [Entry(b"child", job="j")], acks=[lease.member], job_stats=late_stats, participant="cut"
    )
    assert flags == [False]
    after = job_counts(client, queue, "j")
    late = {k: after.pop(k) for k in list(after) if k.startswith("late/")}
    assert after == ended
    assert late == {"late/pages": "4", "late/items": "120", "late/status/200": "4"}


def test_a_participant_closing_its_part_of_an_ended_job_still_counts(
    queue: Base, client: redis.Redis
) -> None:
    """What a process's in-flight pages give once the job closed counts: wait() waits for it."""
    queue.start_job("j", [Entry(b"seed", job="j")], {"spider": "forum"})
    queue.job_store.join("j", "worker")
    assert queue.job_store.end("j", "enough")
    queue.push_many([], job_stats=[("j", "pages", 1), ("j", "items", 2)], participant="worker")
    counts = job_counts(client, queue, "j")
    assert (counts["state"], counts["pages"], counts["items"]) == ("closed", "1", "2")
    assert not [k for k in counts if k.startswith("late/")]


def test_a_lapsed_lease_of_an_ended_job_still_counts_for_its_participant(
    queue: Base, client: redis.Redis
) -> None:
    """A participant paused past its leases while its job ended: the reaper dropped their
    entries unfetched, so its late acks are the only count of the page it fetched and of
    the request it discarded (``purged``)."""
    queue.start_job("j", [Entry(b"a", job="j"), Entry(b"b", job="j")], {"spider": "forum"})
    queue.job_store.join("j", "worker")
    queue.leases = LeaseTimes(0.05)
    fetched, discarded = queue.pop(count=2)
    assert queue.job_store.end("j", "enough")
    time.sleep(0.1)
    queue.requeue_expired()  # the job has ended: its entries are finished, not queued again
    assert (len(queue), queue.in_flight()) == (0, 0)
    stats = [{("j", "pages"): 1, ("j", "items"): 2}, {("j", "purged"): 1}]
    queue.push_many(
        [], acks=[fetched.member, discarded.member], ack_stats=stats, participant="worker"
    )
    counts = job_counts(client, queue, "j")
    assert (counts["state"], counts["pages"], counts["items"]) == ("closed", "1", "2")
    assert counts["purged"] == "1"
    assert not [k for k in counts if k.startswith("late/")]


def test_more_acks_stats_than_acks_is_refused(queue: Base) -> None:
    with pytest.raises(ValueError, match="the stats of 2 acks, for 1 acks"):
        queue.push_many([], acks=[b"m"], ack_stats=[{}, {}])


def test_a_call_that_closes_a_job_by_its_limit_keeps_its_own_stats(
    queue: Base, client: redis.Redis
) -> None:
    queue.start_job("j", [Entry(b"seed", job="j")], {"spider": "forum", "limit/pages": "1"})
    queue.push_many([], job_stats=[("j", "pages", 1), ("j", "items", 2)], participant="w")
    counts = job_counts(client, queue, "j")
    assert (counts["state"], counts["pages"], counts["items"]) == ("closed", "1", "2")
    assert not [k for k in counts if k.startswith("late/")]


def test_a_full_redis_refuses_a_lease_and_a_requeue_whole(tmp_path: Path) -> None:
    """Out of memory, the scripts that pop first are refused before their first pop.

    Redis lets a script whose first write is a pop run on, and every write after
    it: leases were taken, and expired leases requeued, while nothing else could
    be written (docs/failure-semantics.md, "Redis out of memory").
    """
    server = started_valkey(tmp_path / "valkey")
    try:
        client = redis.Redis(port=server.port)
        queue = PriorityQueue(client, SpiderKeys.build("forum", prefix="full"), lease_seconds=0.1)
        queue.push_many([Entry(f"r{i}".encode()) for i in range(10)])
        assert len(queue.lease(4)) == 4
        time.sleep(0.2)  # those four leases expire
        client.set("filler", b"x" * 1_000_000)
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 500_000)
        for refused in (lambda: queue.lease(4), queue.requeue_expired, queue.check_room):
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                refused()
        assert (len(queue), queue.in_flight()) == (6, 4)  # nothing popped, nothing requeued
        client.delete("filler")
        queue.check_room()  # writes nothing
        assert client.exists(queue.keys.seq) == 1 and int(client.get(queue.keys.seq) or 0) == 4
        assert queue.requeue_expired() == 4
        assert len(queue.lease(20)) == 10
    finally:
        server.stop()


def test_a_cancel_keeps_the_other_jobs_entries_of_a_list_in_their_order(
    client: redis.Redis, prefix: str
) -> None:
    from celery_crawl.jobs.handle import Job

    queue = PriorityQueue(client, SpiderKeys.build("c", prefix=prefix))
    queue.start_job("a", [Entry(b"a1", job="a")], {})
    queue.start_job("b", [Entry(b"b1", job="b")], {})
    queue.push_many([Entry(b"a2", job="a"), Entry(b"b2", job="b"), Entry(b"a3", job="a")])
    assert Job("a", "c", client, queue.keys).cancel() == 3
    assert [lease.payload for lease in queue.lease(10)] == [b"b1", b"b2"]
    assert client.hget(queue.keys.job("a"), "state") == b"cancelled"


def test_a_lease_that_fails_leaves_no_time_to_wake_for() -> None:
    """Redis away: no due time of a parked site is kept from before, which would have the
    engine ask again as soon as it passed, again and again, while every ask fails."""
    client = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=None)
    queue = PriorityQueue(client, SpiderKeys.build("forum", prefix="away"))
    queue.next_ready = 0.05  # a parked site's, from the last lease that went through
    with pytest.raises(redis.ConnectionError):
        queue.lease()
    assert queue.next_ready is None
