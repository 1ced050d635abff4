"""The scheduler on a real server: sharing, persistence, batching, dead letters."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
import redis
from scrapy import Request

from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import ConfigError, RedisUnavailable
from celery_crawl.dupefilter.filters import KINDS
from celery_crawl.jobs.handle import Job
from celery_crawl.jobs.signals import JOB_META
from celery_crawl.queue.queues import FifoQueue, LifoQueue, PriorityQueue
from celery_crawl.scheduler.routing import to_spider
from celery_crawl.scheduler.scheduler import Scheduler
from tests.support.round_trips import RoundTrips
from tests.support.schedulers import drain, open_scheduler
from tests.support.stub_spider import ForumSpider


def test_settings_pick_the_components(make_crawler: Any) -> None:
    scheduler = Scheduler.from_crawler(make_crawler())
    assert type(scheduler.queue) is PriorityQueue
    for name, cls in [
        ("scrapy_redis.queue.FifoQueue", FifoQueue),
        ("celery_crawl.queue.LifoQueue", LifoQueue),
    ]:
        crawler = make_crawler(SCHEDULER_QUEUE_CLASS=name)
        assert type(Scheduler.from_crawler(crawler).queue) is cls
    with pytest.raises(ConfigError, match="SCHEDULER_QUEUE_CLASS"):
        Scheduler.from_crawler(make_crawler(SCHEDULER_QUEUE_CLASS="no.such.Queue"))


def test_request_from_one_scheduler_is_served_by_another(make_crawler: Any) -> None:
    producer = open_scheduler(make_crawler(SCHEDULER_PERSIST=True))
    consumer = open_scheduler(make_crawler(SCHEDULER_PERSIST=True))
    spider = producer.spider
    assert producer.enqueue_request(Request("http://127.0.0.1/post/1", callback=spider.parse_post))
    producer.flush()
    request = consumer.next_request()
    assert request is not None and request.url == "http://127.0.0.1/post/1"
    assert request.callback == consumer.spider.parse_post  # type: ignore[union-attr]
    assert producer.next_request() is None


def test_children_of_one_callback_reach_redis_in_one_round_trip(make_crawler: Any) -> None:
    scheduler = open_scheduler(make_crawler())
    scheduler.enqueue_request(Request("http://127.0.0.1/warm-up"))  # the script, loaded once
    scheduler.flush()
    with RoundTrips(scheduler.queue.client) as trips:
        for i in range(200):
            scheduler.enqueue_request(Request(f"http://127.0.0.1/post/{i}", meta={"i": i}))
        assert trips.count == 0
        scheduler.flush()
    assert trips.commands == ["EVALSHA"]
    assert len(scheduler.queue) == 201


def test_duplicates_are_filtered_and_dont_filter_bypasses(make_crawler: Any) -> None:
    crawler = make_crawler()
    scheduler = open_scheduler(crawler)
    for _ in range(3):
        scheduler.enqueue_request(Request("http://127.0.0.1/a"))
    scheduler.enqueue_request(Request("http://127.0.0.1/a", dont_filter=True))
    scheduler.flush()
    assert len(scheduler.queue) == 2
    assert crawler.stats.get_value("dupefilter/filtered") == 2
    assert crawler.stats.get_value("scheduler/enqueued/redis") == 2


def test_acks_finish_leases_after_the_children(make_crawler: Any) -> None:
    scheduler = open_scheduler(make_crawler())
    scheduler.enqueue_request(Request("http://127.0.0.1/parent"))
    scheduler.flush()
    parent = scheduler.next_request()
    assert parent is not None and scheduler.queue.in_flight() == 1
    scheduler.enqueue_request(Request("http://127.0.0.1/child"))
    scheduler.ack(parent)
    with RoundTrips(scheduler.queue.client) as trips:
        scheduler.flush()
    assert trips.commands == ["EVALSHA"]
    assert scheduler.queue.in_flight() == 0
    assert len(scheduler.queue) == 1


@pytest.mark.parametrize("dedup", [kind.path for kind in KINDS.values()])
def test_routed_children_and_the_parents_ack_are_one_atomic_call(
    make_crawler: Any, dedup: str
) -> None:
    """Children for another spider of the group go in the parent's enqueue+ack script."""
    crawler = make_crawler(CELERY_CRAWL_SPIDER_GROUPS={"detail": "forum"}, DUPEFILTER_CLASS=dedup)
    scheduler = open_scheduler(crawler)
    scheduler.enqueue_request(Request("http://127.0.0.1/list"))
    scheduler.flush()
    parent = scheduler.next_request()
    assert parent is not None
    detail = scheduler.router.queue("detail")  # type: ignore[union-attr]
    for url in ["/post/1", "/post/2", "/post/1", "/list/2"]:
        request = Request("http://127.0.0.1" + url)
        scheduler.enqueue_request(to_spider(request, "detail" if "post" in url else None))
    scheduler.ack(parent)
    with RoundTrips(scheduler.queue.client) as trips:
        scheduler.flush()
    assert trips.commands == ["EVALSHA"]
    assert scheduler.queue.in_flight() == 0
    assert (len(scheduler.queue), len(detail)) == (1, 2)  # the duplicate post dropped
    assert crawler.stats.get_value("dupefilter/filtered") == 1
    assert crawler.stats.get_value("scheduler/enqueued/redis") == 4  # list, list/2, 2 posts
    # each request was checked against its own spider's filter
    assert len(scheduler.df) == 2
    assert scheduler.df.seen_fingerprints(
        [scheduler.df.fingerprint(Request("http://127.0.0.1/post/1"))]
    ) == [False]
    scheduler.close("finished")


def test_persist_and_resume_across_two_schedulers(make_crawler: Any) -> None:
    first = open_scheduler(make_crawler(SCHEDULER_PERSIST=True))
    for i in range(10):
        first.enqueue_request(Request(f"http://127.0.0.1/p/{i}"))
    done = [first.next_request() for _ in range(3)]
    for request in done:
        first.ack(request)  # type: ignore[arg-type]
    first.close("shutdown")  # hands back its prefetched leases
    second = open_scheduler(make_crawler(SCHEDULER_PERSIST=True))
    rest = {r.url for r in drain(second)}
    assert rest == {f"http://127.0.0.1/p/{i}" for i in range(3, 10)}
    second.enqueue_request(Request("http://127.0.0.1/p/0"))  # dedup state survived too
    second.flush()
    assert len(second.queue) == 0


def test_without_persist_close_clears_and_flush_on_start_clears(make_crawler: Any) -> None:
    first = open_scheduler(make_crawler(SCHEDULER_PERSIST=False))
    first.enqueue_request(Request("http://127.0.0.1/x"))
    first.close("finished")
    assert len(first.queue) == 0 and len(first.df) == 0
    kept = open_scheduler(make_crawler(SCHEDULER_PERSIST=True))
    kept.enqueue_request(Request("http://127.0.0.1/y"))
    kept.flush()
    fresh = open_scheduler(make_crawler(SCHEDULER_PERSIST=True, SCHEDULER_FLUSH_ON_START=True))
    assert len(fresh.queue) == 0 and len(fresh.df) == 0


def test_undecodable_entries_go_to_the_dead_letter_list(
    make_crawler: Any, client: redis.Redis
) -> None:
    crawler = make_crawler()
    scheduler = open_scheduler(crawler)
    scheduler.queue.push(b"\xc1garbage")
    import msgpack

    scheduler.queue.push(msgpack.packb([1, "http://127.0.0.1/z", "os_system"]))
    scheduler.enqueue_request(Request("http://127.0.0.1/good"))
    scheduler.flush()
    request = scheduler.next_request()
    assert request is not None and request.url == "http://127.0.0.1/good"
    assert scheduler.next_request() is None
    records = [json.loads(r) for r in client.lrange(scheduler.queue.keys.deadletter, 0, -1)]
    assert sorted(r["reason"] for r in records) == ["undecodable", "unknown_callback"]
    assert all(r["entry"] and r["error"] for r in records)
    assert crawler.stats.get_value("celery_crawl/dead_letter/undecodable") == 1
    assert crawler.stats.get_value("celery_crawl/dead_letter/unknown_callback") == 1
    assert scheduler.queue.in_flight() == 1  # only the good one is leased


def start_job_with_a_leased_parent(scheduler: Scheduler, job: str) -> Request:
    """A job whose one seed the scheduler has leased, and a page counted for it."""
    assert scheduler.spider is not None
    payload = scheduler.codec.encode(Request("http://127.0.0.1/seed"), scheduler.spider)
    scheduler.queue.start_job(job, [Entry(payload, job=job)], {"spider": "forum"})
    parent = scheduler.next_request()
    assert parent is not None
    scheduler.job_stats.add(job, "pages")  # as the response signal does
    return parent


def test_a_request_that_cannot_be_queued_is_dead_lettered_counted_and_logged_once(
    make_crawler: Any, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    crawler = make_crawler()
    scheduler = open_scheduler(crawler)
    parent = start_job_with_a_leased_parent(scheduler, "j1")
    callback = scheduler.spider.parse_post  # type: ignore[union-attr]
    for i in range(3):
        meta = {JOB_META: "j1", "handle": object()}
        request = Request(f"http://127.0.0.1/bad/{i}", meta=meta, callback=callback)
        assert scheduler.enqueue_request(request) is False
    assert scheduler.enqueue_request(Request("http://127.0.0.1/good", meta={JOB_META: "j1"}))
    scheduler.ack(parent)
    with RoundTrips(client) as trips:
        scheduler.flush()
    assert trips.commands == ["EVALSHA"]  # drops, the good child and the ack: one step
    records = [json.loads(r) for r in client.lrange(scheduler.queue.keys.deadletter, 0, -1)]
    urls = [r["request"].pop("url") for r in records]
    assert urls == [f"http://127.0.0.1/bad/{i}" for i in (2, 1, 0)]  # newest first
    first = records[-1]
    assert (first["reason"], first["stage"], first["spider"]) == (
        "unserializable",
        "enqueue",
        "forum",
    )
    assert first["request"] == {
        "method": "GET",
        "job": "j1",
        "callback": "parse_post",
        "errback": None,
    }
    assert first["error"] and first["at"]
    job = Job("j1", "forum", client, scheduler.queue.keys).status()
    assert (job.dropped, job.errors) == (3, {"dropped/unserializable": 3})
    assert crawler.stats.get_value("scheduler/dropped/unserializable") == 3
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, "one line per kind, not one per request"
    assert "unserializable" in errors[0] and "To fix:" in errors[0]
    assert scheduler.queue.keys.deadletter in errors[0]


def test_a_job_whose_requests_were_dropped_ends_incomplete(
    make_crawler: Any, client: redis.Redis
) -> None:
    scheduler = open_scheduler(make_crawler())
    parent = start_job_with_a_leased_parent(scheduler, "j2")
    stray = to_spider(Request("http://127.0.0.1/x", meta={JOB_META: "j2"}), "not_in_the_group")
    assert scheduler.enqueue_request(stray) is False
    scheduler.ack(parent)
    scheduler.flush()
    result = Job("j2", "forum", client, scheduler.queue.keys).wait(timeout=5)
    assert (result["state"], result["pages"], result["dropped"]) == ("incomplete", 1, 1)
    assert result["errors"] == {"dropped/unroutable": 1}
    (record,) = [json.loads(r) for r in client.lrange(scheduler.queue.keys.deadletter, 0, -1)]
    assert record["reason"] == "unroutable" and "CELERY_CRAWL_SPIDER_GROUPS" in record["error"]


def test_a_url_scheme_or_method_not_allowed_is_dropped_when_yielded(
    make_crawler: Any, client: redis.Redis
) -> None:
    """Refused at enqueue, with the reason, as it would be when read back from Redis."""
    crawler = make_crawler()
    scheduler = open_scheduler(crawler)
    parent = start_job_with_a_leased_parent(scheduler, "j3")
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/x", "data:text/plain,x"):
        assert scheduler.enqueue_request(Request(url, meta={JOB_META: "j3"})) is False
    put = Request("http://127.0.0.1/x", method="PUT", meta={JOB_META: "j3"})
    assert scheduler.enqueue_request(put) is False
    scheduler.ack(parent)
    scheduler.flush()
    result = Job("j3", "forum", client, scheduler.queue.keys).wait(timeout=5)
    assert result["errors"] == {"dropped/refused_scheme": 3, "dropped/refused_method": 1}
    assert crawler.stats.get_value("scheduler/dropped/refused_scheme") == 3
    assert len(scheduler.queue) == 0  # none queued


def test_a_job_without_drops_still_ends_done(make_crawler: Any, client: redis.Redis) -> None:
    scheduler = open_scheduler(make_crawler())
    parent = start_job_with_a_leased_parent(scheduler, "j3")
    scheduler.ack(parent)
    scheduler.flush()
    result = Job("j3", "forum", client, scheduler.queue.keys).wait(timeout=5)
    assert (result["state"], result["dropped"]) == ("done", 0)


def test_idle_before_close_keeps_the_spider_waiting(make_crawler: Any) -> None:
    import time

    scheduler = open_scheduler(make_crawler(SCHEDULER_IDLE_BEFORE_CLOSE=0.3))
    assert scheduler.has_pending_requests() is True
    time.sleep(0.35)
    assert scheduler.has_pending_requests() is False
    assert open_scheduler(make_crawler()).has_pending_requests() is False


def test_a_lease_held_anywhere_keeps_every_process_waiting(make_crawler: Any) -> None:
    """The queue is empty, but another process's lease may still yield children."""
    busy = open_scheduler(make_crawler(SCHEDULER_PERSIST=True, SCHEDULER_PREFETCH=1))
    idle = open_scheduler(make_crawler(SCHEDULER_PERSIST=True))
    busy.enqueue_request(Request("http://127.0.0.1/parent"))
    busy.flush()
    assert idle.has_pending_requests() is True  # queued
    parent = busy.next_request()
    assert parent is not None and len(busy.queue) == 0
    assert idle.has_pending_requests() is True  # leased by the other process
    busy.ack(parent)  # buffered: the process's own finished lease does not count
    assert busy.has_pending_requests() is False
    assert idle.has_pending_requests() is False


def test_without_persist_only_the_last_scheduler_to_close_clears(make_crawler: Any) -> None:
    first = open_scheduler(make_crawler())
    second = open_scheduler(make_crawler())
    first.enqueue_request(Request("http://127.0.0.1/x"))
    first.close("finished")
    assert len(second.queue) == 1 and len(second.df) == 1  # second still uses them
    second.close("finished")
    assert len(second.queue) == 0 and len(second.df) == 0


def test_unreachable_redis_is_a_clear_error(make_crawler: Any) -> None:
    crawler = make_crawler(
        REDIS_URL="redis://127.0.0.1:1/0", REDIS_PARAMS={"socket_connect_timeout": 0.2}
    )
    scheduler = Scheduler.from_crawler(crawler)
    with pytest.raises(RedisUnavailable, match=r"127\.0\.0\.1:1") as raised:
        scheduler.open(ForumSpider())
    assert "point REDIS_URL at yours" in str(raised.value)  # the next step
    assert "celery-crawl demo" in str(raised.value)


def test_rich_meta_comes_back_equal_through_another_scheduler(make_crawler: Any) -> None:
    """Types included: the class's package is allowed as the package of SPIDER_MODULES."""
    from tests.support.rich_values import rich_meta, same

    settings = {"SCHEDULER_PERSIST": True, "SPIDER_MODULES": ["tests.support.stub_spider"]}
    producer = open_scheduler(make_crawler(**settings))
    consumer = open_scheduler(make_crawler(**settings))
    meta = rich_meta()
    spider = producer.spider
    request = Request(
        "http://127.0.0.1/post/1", callback=spider.parse_post, meta=meta, cb_kwargs={"m": meta}
    )
    assert producer.enqueue_request(request)
    producer.flush()
    leased = consumer.next_request()
    assert leased is not None
    assert same({k: leased.meta[k] for k in meta}, meta)
    assert same(leased.cb_kwargs, {"m": meta})


class OutsideSpider(ForumSpider):
    name = "outside"


def test_a_class_of_the_spiders_own_package_travels(make_crawler: Any) -> None:
    from tests.support.rich_values import Product

    scheduler = open_scheduler(make_crawler())  # ForumSpider, of tests.support.stub_spider
    assert scheduler.enqueue_request(Request("http://127.0.0.1/x", meta={"p": Product()}))
    scheduler.flush()
    leased = scheduler.next_request()
    assert leased is not None
    assert isinstance(leased.meta["p"], Product)


def test_a_class_outside_the_allowed_modules_is_dropped_with_the_reason(
    make_crawler: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.rich_values import Product

    crawler = make_crawler(OutsideSpider)  # its own package, tests.unit, is allowed: not tests
    scheduler = open_scheduler(crawler)
    assert not scheduler.enqueue_request(Request("http://127.0.0.1/x", meta={"p": Product()}))
    scheduler.flush()
    assert crawler.stats.get_value("scheduler/dropped/unserializable") == 1
    assert "meta['p'] holds a tests.support.rich_values.Product" in caplog.text
    assert "add 'tests' to SCHEDULER_ALLOWED_MODULES" in caplog.text


def test_signed_pickle_needs_a_secret_and_dead_letters_forgeries(
    make_crawler: Any, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    from tests.support.rich_values import CALLS, NotAKind

    monkeypatch.delenv("SCHEDULER_PICKLE_SECRET", raising=False)
    with pytest.raises(ConfigError, match="set SCHEDULER_PICKLE_SECRET"):
        Scheduler.from_crawler(make_crawler(SCHEDULER_SERIALIZER="scrapy_redis.picklecompat"))
    settings = {
        "SCHEDULER_SERIALIZER": "scrapy_redis.picklecompat",
        "SCHEDULER_PICKLE_SECRET": "one-secret-for-the-whole-crawl",
    }
    crawler = make_crawler(**settings)
    scheduler = open_scheduler(crawler)
    scheduler.queue.push(pickle.dumps([1, "http://127.0.0.1/evil"]))
    forged = make_crawler(**{**settings, "SCHEDULER_PICKLE_SECRET": "not-the-secret-of-the-crawl"})
    other = open_scheduler(forged)
    other.enqueue_request(Request("http://127.0.0.1/forged"))
    other.flush()
    scheduler.enqueue_request(Request("http://127.0.0.1/good", meta={"any": NotAKind}))
    scheduler.flush()
    CALLS.clear()
    requests = drain(scheduler)
    assert [(r.url, r.meta["any"]) for r in requests] == [("http://127.0.0.1/good", NotAKind)]
    records = [json.loads(r) for r in client.lrange(scheduler.queue.keys.deadletter, 0, -1)]
    assert sorted(r["reason"] for r in records) == ["bad_signature", "unsigned"]
    assert crawler.stats.get_value("celery_crawl/dead_letter/bad_signature") == 1
    assert CALLS == []


def test_a_scheduler_that_opens_leaves_expired_leases_to_their_holders_for_a_lease_time(
    make_crawler: Any,
) -> None:
    """It may open because Redis took writes again after it was out of memory: holders
    whose renewals Redis refused meanwhile renew first (docs/failure-semantics.md)."""
    holder = open_scheduler(make_crawler(SCHEDULER_PERSIST=True, SCHEDULER_LEASE_SECONDS=0.5))
    holder.enqueue_request(Request("http://127.0.0.1/held"))
    holder.flush()
    assert holder.next_request() is not None
    time.sleep(0.6)  # the lease expired: its renewals were refused, say
    opened = open_scheduler(make_crawler(SCHEDULER_PERSIST=True, SCHEDULER_LEASE_SECONDS=0.5))
    assert (len(opened.queue), opened.queue.in_flight()) == (0, 1)  # not taken from its holder
    holder.renew()  # the holder's beat renews it
    time.sleep(0.6)  # a lease time after the opening; the holder has died since
    opened.renew()
    assert (len(opened.queue), opened.queue.in_flight()) == (1, 0)  # requeued now


def test_a_page_done_whose_ack_waits_keeps_its_lease_renewed(make_crawler: Any) -> None:
    """The engine is done with the page; its ack waits for the next flush (a callback
    holds the reactor, its items are being made durable, Redis is away): the heartbeat
    renews its lease, so no scheduler requeues it and no process crawls it again."""
    scheduler = open_scheduler(make_crawler(SCHEDULER_LEASE_SECONDS=2))
    scheduler.enqueue_request(Request("http://127.0.0.1/done"))
    scheduler.flush()
    request = scheduler.next_request()
    assert request is not None
    scheduler.ack(request)  # no reactor runs here: the flush waits to be called
    for _ in range(6):  # 2.4 s: past the lease time
        time.sleep(0.4)
        scheduler.renew()  # the heartbeat: renew, then requeue what expired anywhere
    assert (len(scheduler.queue), scheduler.queue.in_flight()) == (0, 1)
    scheduler.flush()
    assert (len(scheduler.queue), scheduler.queue.in_flight()) == (0, 0)
    assert scheduler.prefetch.held() == []


def test_a_scheduler_opens_over_a_damaged_registration_even_just_after_a_repair(
    make_crawler: Any,
) -> None:
    """A hosted crawler that fails to open stops its worker: a damaged key met on opening
    is moved aside and the opening goes on (a worker process opening while the keys are
    damaged mid-crawl), even when this spider was repaired within ``REPAIR_SECONDS``."""
    for just_repaired in (False, True):
        crawler = make_crawler()
        scheduler = Scheduler.from_crawler(crawler)
        keys, client = scheduler.queue.keys, scheduler.queue.client
        if just_repaired:
            client.set(keys.dupefilter_count, "abc")
            assert scheduler.repairer.after(redis.ResponseError("WRONGTYPE"))
        client.delete(keys.open_schedulers + "~damaged")
        client.set(keys.open_schedulers, "not a sorted set")
        scheduler.open(ForumSpider.from_crawler(crawler))
        assert client.type(keys.open_schedulers) == b"zset"  # registered, afresh
        assert client.get(keys.open_schedulers + "~damaged") == b"not a sorted set"
        scheduler.close("finished")
