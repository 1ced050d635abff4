"""The scheduler's write-behind buffer and prefetch: no reactor, a fake clock, a real server."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import redis
from scrapy import Request

from celery_crawl.core.connection import get_redis
from celery_crawl.core.entries import Entry, Lease
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.queue.leases import LeaseTimes
from celery_crawl.queue.queues import Base, PriorityQueue
from celery_crawl.scheduler.buffer import RETRY_DELAY, Pending, WriteBehind
from celery_crawl.scheduler.prefetch import Prefetch
from tests.support.ports import free_port
from tests.support.reply_cutter import ReplyCutter
from tests.support.round_trips import RoundTrips


@dataclass
class Timer:
    due: float
    fn: Callable[[], None]
    fired: bool = False

    def active(self) -> bool:
        return not self.fired


@dataclass
class FakeClock:
    """``call_later`` for the buffer: timers fire only when the test advances time."""

    now: float = 0.0
    timers: list[Timer] = field(default_factory=list)

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(self.now + delay, fn)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for timer in [t for t in self.timers if t.active() and t.due <= self.now]:
            timer.fired = True
            timer.fn()


@pytest.fixture
def queue(client: redis.Redis, prefix: str) -> Base:
    return PriorityQueue(client, SpiderKeys.build("buffered", prefix=prefix))


def pending(n: int, job: str = "") -> list[Pending]:
    return [
        Pending(
            Request(f"http://127.0.0.1/{i}"),
            Entry(f"r{i}".encode(), 0, f"fp{i}".encode(), job),
            None,
        )
        for i in range(n)
    ]


def make_buffer(
    queue: Base, clock: FakeClock, written: list[tuple[int, list[bool]]], **kw: int
) -> WriteBehind:
    queue.push_many([], job_stats=[("warm-up", "pages", 0)])  # the server caches the script
    return WriteBehind(
        queue,
        lambda p, flags: written.append((len(p), flags)),
        call_later=clock.call_later,
        delay=kw.get("delay", 0.01),
        batch_size=kw.get("batch_size", 500),
    )


Written = list[tuple[int, list[bool]]]


def test_requests_wait_for_the_delay_then_go_in_one_round_trip(queue: Base) -> None:
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    for item in pending(5):
        buffer.add(item)
    assert len(queue) == 0 and len(buffer) == 5
    assert len([t for t in clock.timers if t.active()]) == 1  # one flush scheduled, not five
    with RoundTrips(queue.client) as trips:
        clock.advance(0.01)
    assert trips.count == 1
    assert written == [(5, [True] * 5)]
    assert len(queue) == 5 and len(buffer) == 0


def test_a_full_batch_is_written_at_once(queue: Base) -> None:
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written, batch_size=3)
    for item in pending(3):
        buffer.add(item)
    assert written == [(3, [True, True, True])]
    assert len(queue) == 3


def test_duplicates_are_reported_as_not_written(queue: Base) -> None:
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    for item in pending(2) + pending(2):
        buffer.add(item)
    buffer.flush()
    assert written == [(4, [True, True, False, False])]


def test_acks_go_with_the_children_in_the_same_call(queue: Base) -> None:
    queue.start_job("j", [Entry(b"parent", job="j")], {"spider": "buffered"})
    [lease] = queue.lease(1)
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    for item in pending(2, job="j"):
        buffer.add(item)
    buffer.ack(lease.member)
    buffer.job_stats.add("j", "pages")
    with RoundTrips(queue.client) as trips:
        clock.advance(0.01)
    assert trips.count == 1
    assert queue.in_flight() == 0 and len(queue) == 2
    job = queue.client.hgetall(queue.keys.job("j"))
    assert job[b"pages"] == b"1" and job[b"done"] == b"1"


def test_acks_wait_for_their_items_and_stay_unsent_when_those_cannot_be_kept(
    queue: Base,
) -> None:
    """``before_acks`` runs once before each write with acks (the feeds flush there); when
    it raises (a full disk), that write's acks are not sent: the leases expire and the
    pages are crawled again. The children still go in."""
    queue.start_job("j", [Entry(b"a", job="j"), Entry(b"b", job="j")], {"spider": "buffered"})
    first, second = queue.lease(2)
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    in_flight_when_settled: list[int] = []

    def settle() -> None:
        in_flight_when_settled.append(queue.in_flight())
        if len(in_flight_when_settled) == 2:
            raise OSError(28, "No space left on device")

    buffer.before_acks = settle
    buffer.ack(first.member)
    clock.advance(0.01)
    assert in_flight_when_settled == [2] and queue.in_flight() == 1  # settled, then acked
    for item in pending(2, job="j"):
        buffer.add(item)
    buffer.ack(second.member, Counter({("j", "pages"): 1}))
    buffer.job_stats.add("j", "retries")  # tied to no page: goes whatever the acks do
    clock.advance(0.01)
    assert in_flight_when_settled == [2, 1]
    assert queue.in_flight() == 1 and len(queue) == 2  # not acked; the children are in
    job = queue.client.hgetall(queue.keys.job("j"))
    assert b"pages" not in job  # nor its page's stats: counted once, when crawled again
    assert job[b"retries"] == b"1"


def test_a_pages_stats_go_with_its_ack_only(queue: Base) -> None:
    """Changes given with an ack are written in that ack's call; those not tied to a page
    (a retry, a duplicate) go with the next call whatever it holds."""
    queue.start_job("j", [Entry(b"a", job="j")], {"spider": "buffered"})
    [lease] = queue.lease(1)
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    buffer.job_stats.add("j", "retries")
    buffer.ack(lease.member, Counter({("j", "pages"): 1, ("j", "items"): 2}))
    with RoundTrips(queue.client) as trips:
        clock.advance(0.01)
    assert trips.count == 1
    job = queue.client.hgetall(queue.keys.job("j"))
    assert (job[b"pages"], job[b"items"], job[b"retries"], job[b"done"]) == (b"1", b"2", b"1", b"1")


def lapsed_then_fetched_again(queue: Base) -> tuple[Lease, Lease, Lease]:
    """Job ``j`` of two pages, ``a`` and ``b``: ``a``'s first lease lapsed and went back to
    the queue; both leased again. Returns the lapsed lease, ``a``'s new one and ``b``'s."""
    queue.start_job("j", [Entry(b"a", job="j"), Entry(b"b", job="j")], {"spider": "buffered"})
    queue.leases = LeaseTimes(0.05)
    [lapsed] = queue.lease(1)
    time.sleep(0.1)
    assert queue.requeue_expired() == 1
    queue.leases = LeaseTimes(60)
    fetched_again, other = sorted(queue.lease(2), key=lambda lease: lease.payload)
    assert (fetched_again.payload, other.payload) == (lapsed.payload, b"b")
    return lapsed, fetched_again, other


def test_a_page_whose_lease_lapsed_and_was_fetched_again_counts_once(queue: Base) -> None:
    """A process that could not renew a lease (Redis away, the process paused) acks it
    after the lease was requeued and leased again: the page counts once, the late
    ack's stats kept apart in ``late/*``. One call acks a lapsed lease and a held one."""
    lapsed, fetched_again, other = lapsed_then_fetched_again(queue)
    clock, written = FakeClock(), Written()
    late, holder = make_buffer(queue, clock, written), make_buffer(queue, clock, written)
    late.ack(lapsed.member, Counter({("j", "pages"): 1, ("j", "items"): 2}))
    late.ack(other.member, Counter({("j", "pages"): 1, ("j", "items"): 5}))
    clock.advance(0.01)
    holder.ack(fetched_again.member, Counter({("j", "pages"): 1, ("j", "items"): 2}))
    clock.advance(0.01)
    job = {k.decode(): v.decode() for k, v in queue.client.hgetall(queue.keys.job("j")).items()}
    assert (job["state"], job["pages"], job["items"], job["done"]) == ("done", "2", "7", "2")
    assert (job["late/pages"], job["late/items"]) == ("1", "2")


def test_a_job_ended_with_its_last_pages_ack_is_closed_with_that_pages_stats(
    queue: Base,
) -> None:
    """A callback's CloseSpider ends its job with its page's ack, in one call: the page's
    stats count in the job before it ends, and the ack, the last the job waited for,
    does not end it done."""
    queue.start_job("j", [Entry(b"a", job="j")], {"spider": "buffered"})
    [lease] = queue.lease(1)
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    buffer.ack(lease.member, Counter({("j", "pages"): 1, ("j", "items"): 3}))
    buffer.end_job("j", "enough")
    with RoundTrips(queue.client) as trips:
        clock.advance(0.01)
    assert trips.count == 1
    job = {k.decode(): v.decode() for k, v in queue.client.hgetall(queue.keys.job("j")).items()}
    assert (job["state"], job["reason"]) == ("closed", "enough")
    assert (job["pages"], job["items"], job["done"]) == ("1", "3", "1")
    assert queue.in_flight() == 0


def test_a_job_ended_at_the_ack_of_a_lapsed_lease_counts_that_page_once(queue: Base) -> None:
    """The page whose callback ended the job was fetched again by another process after
    its lease lapsed: the late ack's stats go to ``late/*`` (the lapsed-lease rule), not
    to the job's counts a second time, and the job still ends with its reason."""
    lapsed, fetched_again, _ = lapsed_then_fetched_again(queue)
    clock, written = FakeClock(), Written()
    late, holder = make_buffer(queue, clock, written), make_buffer(queue, clock, written)
    holder.ack(fetched_again.member, Counter({("j", "pages"): 1, ("j", "items"): 2}))
    clock.advance(0.01)
    late.ack(lapsed.member, Counter({("j", "pages"): 1, ("j", "items"): 2}))
    late.end_job("j", "enough")
    clock.advance(0.01)
    job = {k.decode(): v.decode() for k, v in queue.client.hgetall(queue.keys.job("j")).items()}
    assert (job["state"], job["reason"]) == ("closed", "enough")
    assert (job["pages"], job["items"]) == ("1", "2")  # the page, counted once
    assert (job["late/pages"], job["late/items"]) == ("1", "2")


def test_an_end_asked_while_redis_is_away_is_sent_with_the_retry(queue: Base) -> None:
    queue.start_job("j", [Entry(b"a", job="j")], {"spider": "buffered"})
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    live = queue.client
    queue.client = redis.Redis(port=free_port(), socket_connect_timeout=1)  # nobody listens
    buffer.end_job("j", "enough")
    clock.advance(0.01)
    assert buffer.unconfirmed is not None and buffer.unconfirmed.ends == [("j", "enough")]
    queue.client = live
    clock.advance(RETRY_DELAY)
    assert buffer.unconfirmed is None
    assert queue.client.hget(queue.keys.job("j"), "state") == b"closed"


def test_redis_away_keeps_everything_and_retries_a_second_later(queue: Base) -> None:
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    live = queue.client
    queue.client = redis.Redis(port=free_port(), socket_connect_timeout=1)  # nobody listens
    for item in pending(3):
        buffer.add(item)
    buffer.job_stats.add("j", "pages", 2)
    clock.advance(0.01)
    assert written == [] and len(buffer) == 3
    assert buffer.unconfirmed is not None and buffer.unconfirmed.job_stats == [("j", "pages", 2)]
    queue.client = live
    clock.advance(RETRY_DELAY / 2)
    assert written == []  # the retry waits a second, not a tight loop
    clock.advance(RETRY_DELAY / 2)
    assert written == [(3, [True] * 3)] and len(queue) == 3


def test_a_retry_sends_the_same_call_before_anything_buffered_since(queue: Base) -> None:
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    live = queue.client
    queue.client = redis.Redis(port=free_port(), socket_connect_timeout=1)  # nobody listens
    for item in pending(2):
        buffer.add(item)
    clock.advance(0.01)
    queue.client = live
    buffer.add(pending(3)[2])
    with RoundTrips(live) as trips:
        clock.advance(RETRY_DELAY)
    assert trips.count == 2 and written == [(2, [True, True]), (1, [True])]
    assert buffer.unconfirmed is None and len(buffer) == 0


def test_a_call_whose_reply_was_lost_is_applied_once(redis_url: str, prefix: str) -> None:
    """Redis ran the call, the reply never came, redis-py sent it again: counted once."""
    with ReplyCutter(redis_url) as relay:
        queue = PriorityQueue(get_redis(relay.url), SpiderKeys.build("buffered", prefix=prefix))
        queue.start_job("j", [Entry(b"parent", job="j")], {"spider": "buffered"})
        [lease] = queue.lease(1)
        clock, written = FakeClock(), Written()
        buffer = make_buffer(queue, clock, written)
        for item in pending(2, job="j"):
            buffer.add(item)
        buffer.ack(lease.member)
        buffer.job_stats.add("j", "items", 14)
        buffer.dead_letter('{"reason": "unserializable"}')
        relay.cut_next_reply()
        clock.advance(0.01)
        assert relay.cuts == 1  # the reply was lost: the call reached Redis again
        assert written == [(2, [True, True])]  # the first run's flags, not "duplicates"
        job = queue.client.hgetall(queue.keys.job("j"))
        assert (job[b"items"], job[b"done"], job[b"pending"]) == (b"14", b"1", b"2")
        assert queue.client.llen(queue.keys.deadletter) == 1
        assert len(queue) == 2 and queue.in_flight() == 0


def test_without_a_call_number_a_lost_reply_counts_twice(redis_url: str, prefix: str) -> None:
    """What the number guards against: redis-py resends a call whose reply was lost."""
    with ReplyCutter(redis_url) as relay:
        queue = PriorityQueue(get_redis(relay.url), SpiderKeys.build("buffered", prefix=prefix))
        queue.start_job("j", [Entry(b"parent", job="j")], {"spider": "buffered"})
        queue.push_many([], job_stats=[("j", "items", 0)])  # the server caches the script
        relay.cut_next_reply()
        queue.push_many([], job_stats=[("j", "items", 14)])
        assert relay.cuts == 1
        assert queue.client.hget(queue.keys.job("j"), "items") == b"28"


def test_prefetch_leases_a_batch_and_hands_it_out_one_by_one(queue: Base) -> None:
    queue.push_many([Entry(f"r{i}".encode(), fingerprint=f"f{i}".encode()) for i in range(5)])
    prefetch = Prefetch(queue.lease, size=2)
    with RoundTrips(queue.client) as trips:
        first, second, third = prefetch.next(), prefetch.next(), prefetch.next()
    assert trips.count == 2  # two leases of two, not three of one
    assert first and second and third
    assert [first.payload, second.payload, third.payload] == [b"r0", b"r1", b"r2"]
    prefetch.hand_out("request-0", first)
    assert (
        sorted(prefetch.held()) == sorted([first.member, third.member]) or len(prefetch.held()) == 2
    )
    assert prefetch.finish("request-0") == first.member
    assert prefetch.finish("request-0") is None  # acked once only
    assert queue.in_flight() == 4  # third is leased with the fourth, still waiting
    prefetch.clear()
    assert prefetch.held() == [] and len(prefetch) == 0


def test_prefetch_on_an_empty_queue_gives_none(queue: Base) -> None:
    assert Prefetch(queue.lease, size=4).next() is None


def test_dead_letters_go_with_the_job_stats_and_the_ack_and_wait_out_an_outage(
    queue: Base,
) -> None:
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    queue.start_job("j", [Entry(b"parent", job="j")], {})
    (lease,) = queue.lease(1)
    live = queue.client
    queue.client = redis.Redis(port=free_port(), socket_connect_timeout=1)  # nobody listens
    buffer.dead_letter('{"reason": "unserializable"}')
    buffer.job_stats.add("j", "dropped")
    buffer.ack(lease.member)
    clock.advance(0.01)
    kept = buffer.unconfirmed  # kept for the retry, as it was
    assert kept is not None and kept.dead_letters and kept.acks and kept.job_stats
    queue.client = live
    with RoundTrips(live) as trips:
        clock.advance(RETRY_DELAY)
    assert trips.count == 1
    assert live.lrange(queue.keys.deadletter, 0, -1) == [b'{"reason": "unserializable"}']
    job = live.hgetall(queue.keys.job("j"))
    assert (job[b"dropped"], job[b"state"]) == (b"1", b"incomplete")


def test_a_lease_is_held_until_its_ack_is_written_or_given_up(queue: Base) -> None:
    """Done by the engine, a page's lease waits for the flush: still held (renewed by the
    heartbeat) until its ack is written; let go unsent when its items cannot be kept."""
    queue.push_many([Entry(f"r{i}".encode(), fingerprint=f"f{i}".encode()) for i in range(3)])
    prefetch = Prefetch(queue.lease, size=3)
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    buffer.let_go = prefetch.let_go
    acked, unkept, discarded = (prefetch.next() for _ in range(3))
    assert acked and unkept and discarded
    prefetch.hand_out("request-0", acked)
    prefetch.hand_out("request-1", unkept)
    buffer.ack(prefetch.finish("request-0") or b"")
    buffer.ack(prefetch.finish_unhanded(discarded))  # of a job that ended: never handed out
    assert sorted(prefetch.held()) == sorted([acked.member, unkept.member, discarded.member])
    live = queue.client
    queue.client = redis.Redis(port=free_port(), socket_connect_timeout=1)  # Redis away
    clock.advance(0.01)
    assert buffer.unconfirmed is not None and len(prefetch.held()) == 3  # kept: still held
    queue.client = live
    assert queue.renew(prefetch.held()) == 3  # what the heartbeat renews
    clock.advance(RETRY_DELAY)
    assert prefetch.held() == [unkept.member] and queue.in_flight() == 1
    buffer.before_acks = disk_full
    buffer.ack(prefetch.finish("request-1") or b"")
    clock.advance(0.01)
    assert prefetch.held() == [] and queue.in_flight() == 1  # not acked: left to expire


def disk_full() -> None:
    raise OSError(28, "No space left on device")


def test_a_call_redis_refuses_lets_its_acks_go_and_lands_once_repaired(queue: Base) -> None:
    """Refused (a damaged key), the call is sent again each second; its acks are no longer
    held, so a refusal for good lets their leases expire instead of pinning their pages."""
    queue.push_many([Entry(b"r0", fingerprint=b"f0")])
    prefetch = Prefetch(queue.lease, size=1)
    clock, written = FakeClock(), Written()
    buffer = make_buffer(queue, clock, written)
    buffer.let_go = prefetch.let_go
    lease = prefetch.next()
    assert lease is not None
    prefetch.hand_out("request", lease)
    buffer.add(pending(1)[0])  # its child
    buffer.ack(prefetch.finish("request") or b"")
    queue.client.set(queue.keys.queue, "damaged")  # the priority levels: of the wrong type
    clock.advance(0.01)
    assert buffer.unconfirmed is not None and prefetch.held() == []
    queue.client.delete(queue.keys.queue)  # repaired
    clock.advance(RETRY_DELAY)
    assert buffer.unconfirmed is None and queue.in_flight() == 0  # the ack landed
    assert len(queue) == 1 and written == [(1, [True])]  # with the child
