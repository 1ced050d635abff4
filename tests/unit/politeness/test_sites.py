"""Per-site limits in the lease script, on a real server: caps, rates, parking, pauses."""

from __future__ import annotations

import re
import time

import pytest
import redis
from scrapy import Request
from scrapy.settings import Settings

from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.jobs.handle import Job
from celery_crawl.politeness.sites import (
    AutoThrottle,
    Backoff,
    Limits,
    SitePolicy,
    SiteState,
    read_sites,
    retry_after,
)
from celery_crawl.queue.queues import Base, LifoQueue, PriorityQueue


def queue_with(
    client: redis.Redis,
    prefix: str,
    limits: Limits,
    cls: type[Base] = PriorityQueue,
    **over: Limits,
) -> Base:
    policy = SitePolicy(limits=limits, overrides=over)
    queue = cls(client, SpiderKeys.build("sites", prefix=prefix), lease_seconds=60, sites=policy)
    SiteState(client, queue.keys, policy).publish_limits()
    return queue


def entry(name: str, site: str, priority: int = 0, job: str = "") -> Entry:
    return Entry(name.encode(), priority, None, job, site)


def names(leases: list) -> list[str]:
    return [lease.payload.decode() for lease in leases]


def test_a_site_at_its_cap_leases_no_more_until_an_ack(client: redis.Redis, prefix: str) -> None:
    queue = queue_with(client, prefix, Limits(concurrency=2))
    queue.push_many([entry(f"a{i}", "a.example") for i in range(6)])
    first = queue.lease(10)
    assert names(first) == ["a0", "a1"]
    assert queue.lease(10) == []
    assert len(queue) == 4  # parked entries are still queued
    queue.ack([first[0].member])
    assert names(queue.lease(10)) == ["a2"]
    state = SiteState(client, queue.keys, queue.sites).read()["a.example"]
    assert state["inflight"] == "2"


def test_a_blocked_site_holds_back_no_other_site(client: redis.Redis, prefix: str) -> None:
    """Head-of-line: the slow site's entries come first and at a higher priority."""
    queue = queue_with(client, prefix, Limits(), **{"slow.example": Limits(concurrency=1)})
    queue.push_many([entry(f"s{i}", "slow.example", priority=10) for i in range(50)])
    queue.push_many([entry(f"f{i}", "fast.example") for i in range(5)])
    leased = names(queue.lease(6))
    assert leased == ["s0", "f0", "f1", "f2", "f3", "f4"]


@pytest.mark.alone  # the next lease due within 100 ms
def test_a_rate_spaces_leases_and_says_when_the_next_is_due(
    client: redis.Redis, prefix: str
) -> None:
    queue = queue_with(client, prefix, Limits(rate=5))  # one per 200 ms
    queue.push_many([entry(f"a{i}", "a.example") for i in range(3)])
    assert names(queue.lease(3)) == ["a0"]
    assert queue.lease(3) == []
    assert queue.next_ready is not None and 0.1 < queue.next_ready <= 0.2
    times = []
    deadline = time.monotonic() + 5
    while len(times) < 2 and time.monotonic() < deadline:
        if queue.lease(1):
            times.append(time.monotonic())
        time.sleep(0.005)
    assert len(times) == 2 and times[1] - times[0] >= 0.19


def test_a_burst_leases_that_many_at_once(client: redis.Redis, prefix: str) -> None:
    queue = queue_with(client, prefix, Limits(rate=1, burst=3))
    queue.push_many([entry(f"a{i}", "a.example") for i in range(5)])
    assert names(queue.lease(5)) == ["a0", "a1", "a2"]


@pytest.mark.parametrize("rate", [0.5, 4.0])  # limits wider than the delay, and narrower
def test_a_crawl_delay_allows_no_burst(client: redis.Redis, prefix: str, rate: float) -> None:
    queue = queue_with(client, prefix, Limits(rate=rate, burst=3))
    SiteState(client, queue.keys).crawl_delay("a.example", 1.0)
    queue.push_many([entry(f"a{i}", "a.example") for i in range(5)])
    assert names(queue.lease(5)) == ["a0"]  # one now, the next no sooner than the delay
    assert queue.lease(5) == []
    assert queue.next_ready is not None and queue.next_ready > 0.9


def test_priority_holds_within_a_parked_site(client: redis.Redis, prefix: str) -> None:
    queue = queue_with(client, prefix, Limits(concurrency=1))
    queue.push_many([entry("first", "a.example")])
    held = queue.lease(1)
    queue.push_many([entry("low", "a.example", 0), entry("high", "a.example", 5)])
    assert queue.lease(5) == []  # both parked, at their levels
    queue.ack([held[0].member])
    assert names(queue.lease(5)) == ["high"]


def test_lifo_order_holds_for_parked_entries(client: redis.Redis, prefix: str) -> None:
    queue = queue_with(client, prefix, Limits(concurrency=1), cls=LifoQueue)
    queue.push_many([entry(f"a{i}", "a.example") for i in range(4)])
    held = queue.lease(4)
    assert names(held) == ["a3"]
    queue.ack([held[0].member])
    assert names(queue.lease(4)) == ["a2"]


def test_a_requeued_lease_gives_its_site_the_slot_back(client: redis.Redis, prefix: str) -> None:
    queue = queue_with(client, prefix, Limits(concurrency=1))
    queue.push_many([entry("a0", "a.example"), entry("a1", "a.example")])
    held = queue.lease(2)
    assert queue.release([held[0].member]) == 1
    assert names(queue.lease(2)) == ["a0"]


def test_a_back_off_pauses_the_site_for_every_lease(client: redis.Redis, prefix: str) -> None:
    queue = queue_with(client, prefix, Limits())
    state = SiteState(client, queue.keys, queue.sites)
    queue.push_many([entry("a0", "a.example"), entry("b0", "b.example")])
    assert state.backoff("a.example", 2.0) > 1900
    assert names(queue.lease(2)) == ["b0"]
    assert queue.lease(2) == []
    assert queue.next_ready is not None and 1.8 < queue.next_ready <= 2.0
    wait, strikes = state.gate("a.example")
    assert 1800 < wait <= 2000 and strikes == 1


def test_back_offs_in_a_row_double_then_pause_and_a_success_ends_them(
    client: redis.Redis, prefix: str
) -> None:
    queue = queue_with(client, prefix, Limits())
    policy = SitePolicy(
        backoff=SitePolicy().backoff.__class__(first=0.01, longest=0.05, pause_after=4, pause=30)
    )
    state = SiteState(client, queue.keys, policy)
    waits = [state.backoff("a.example", None) for _ in range(3)]
    assert waits[0] <= 10 and waits[2] >= 30  # 10, 20, 40 ms: each at least the one before
    assert state.backoff("a.example", None) > 29_000  # the fourth in a row: paused
    state.success("a.example", None, 200)
    assert state.gate("a.example")[1] == 0


def test_cancelled_jobs_parked_entries_are_purged_not_leased(
    client: redis.Redis, prefix: str
) -> None:
    queue = queue_with(client, prefix, Limits(concurrency=1))
    queue.start_job("j1", [entry(f"a{i}", "a.example", job="j1") for i in range(3)], {})
    held = queue.lease(3)
    assert len(held) == 1 and held[0].site == "a.example" and held[0].job == "j1"
    queue.job_store.end("j1", "test")
    queue.ack([held[0].member])
    assert queue.lease(3) == []
    assert len(queue) == 0
    purged = client.hget(queue.keys.job("j1"), "purged")
    assert purged is not None and int(purged) == 2


def test_clear_deletes_every_parked_entry(client: redis.Redis, prefix: str) -> None:
    queue = queue_with(client, prefix, Limits(concurrency=1))
    queue.push_many([entry(f"a{i}", "a.example") for i in range(3)])
    queue.lease(3)
    queue.clear()
    assert not client.keys(queue.keys.parked + "*")


def test_without_limits_entries_with_sites_lease_in_plain_order(
    client: redis.Redis, prefix: str
) -> None:
    queue = PriorityQueue(client, SpiderKeys.build("sites", prefix=prefix))
    queue.push_many([entry(f"a{i}", "a.example") for i in range(3)])
    assert names(queue.lease(3)) == ["a0", "a1", "a2"]
    assert queue.next_ready is None


def test_entries_parked_while_limits_were_on_are_leased_once_they_are_off(
    client: redis.Redis, prefix: str
) -> None:
    limited = queue_with(client, prefix, Limits(concurrency=1))
    limited.start_job("j4", [entry(f"a{i}", "a.example", job="j4") for i in range(4)], {})
    held = limited.lease(4)  # a0 leased, a1 to a3 parked
    assert names(held) == ["a0"]
    plain = PriorityQueue(client, limited.keys, lease_seconds=60, sites=SitePolicy(enabled=False))
    plain.push_many([Entry(b"b0", 0, None, "j4", "")])  # pushed with limits off: no site
    assert plain.release([held[0].member]) == 1  # handed back: before its site's parked ones
    assert names(plain.lease(2)) == ["b0", "a0"]  # the queue's own levels first
    rest = plain.lease(10)
    assert names(rest) == ["a1", "a2", "a3"]
    assert len(plain) == 0 and not client.keys(limited.keys.parked + "*")
    assert not client.smembers(limited.keys.site("a.example") + ":waiting")


def test_an_entry_carries_job_fingerprint_and_site(client: redis.Redis, prefix: str) -> None:
    queue = queue_with(client, prefix, Limits())
    queue.start_job("j2", [Entry(b"payload", 0, b"\x01" * 16, "j2", "a.example")], {})
    (lease,) = queue.lease(1)
    assert (lease.job, lease.site, lease.payload) == ("j2", "a.example", b"payload")


def test_the_site_of_a_request() -> None:
    request = Request("https://Forum.Example.co.uk:8443/t/1")
    assert SitePolicy().site_of(request) == "forum.example.co.uk"
    assert SitePolicy(key="domain").site_of(request) == "example.co.uk"
    assert SitePolicy(key="ip").site_of(Request("http://127.0.0.1/")) == "127.0.0.1"
    assert SitePolicy().site_of(Request("http://a.example/", meta={"site": "mine"})) == "mine"
    assert SitePolicy(enabled=False).site_of(request) == ""
    with pytest.raises(ConfigError, match="site key"):
        SitePolicy().site_of(Request("http://a.example/", meta={"site": "~x"}))


def test_defaults_come_from_scrapys_own_settings() -> None:
    settings = Settings({"CONCURRENT_REQUESTS_PER_DOMAIN": 3, "DOWNLOAD_DELAY": 0.5})
    assert SitePolicy.from_settings(settings).limits == Limits(3, 2.0, 1)
    over = Settings({"SITE_OVERRIDES": {"a.example": {"rate": 10}}, "SITE_CONCURRENCY": 0})
    assert SitePolicy.from_settings(over).overrides["a.example"] == Limits(0, 10.0, 1)
    with pytest.raises(ConfigError, match="SITE_KEY"):
        SitePolicy.from_settings(Settings({"SITE_KEY": "port"}))
    with pytest.raises(ConfigError, match="speed"):
        SitePolicy.from_settings(Settings({"SITE_OVERRIDES": {"a": {"speed": 1}}}))


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after(b"2") == 2.0
    assert retry_after(None) is None and retry_after(b"soon") is None
    in_a_minute = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))
    found = retry_after(in_a_minute)
    assert found is not None and 55 < found <= 60


def test_cancel_purges_parked_entries_too(client: redis.Redis, prefix: str) -> None:
    queue = queue_with(client, prefix, Limits(concurrency=1))
    queue.start_job("j3", [entry(f"a{i}", "a.example", job="j3") for i in range(4)], {})
    held = queue.lease(4)  # one leased, three parked
    assert len(held) == 1 and len(queue) == 3
    Job("j3", "sites", client, queue.keys, [queue.keys], dedup=queue.dedup).cancel()
    assert len(queue) == 0
    assert not client.exists(queue.keys.parked)


def test_the_spiders_of_a_group_share_their_sites_limits(client: redis.Redis, prefix: str) -> None:
    policy = SitePolicy(limits=Limits(concurrency=2))
    one, two = (
        PriorityQueue(client, SpiderKeys.build(name, group="g", prefix=prefix), sites=policy)
        for name in ("g", "g_detail")
    )
    one.push_many([entry(f"a{i}", "a.example") for i in range(2)])
    two.push_many([entry(f"b{i}", "a.example") for i in range(2)])
    held = one.lease(2)
    assert len(held) == 2 and two.lease(2) == []  # the site's two slots are taken
    one.ack([held[0].member])
    assert names(two.lease(2)) == ["b0"]


def test_a_lost_lease_stops_counting_at_its_deadline(client: redis.Redis, prefix: str) -> None:
    """A cleared queue (or a lost write) cannot keep a site's slot for good."""
    policy = SitePolicy(limits=Limits(concurrency=1))
    keys = SpiderKeys.build("sites", prefix=prefix)
    queue = PriorityQueue(client, keys, lease_seconds=0.3, sites=policy)
    queue.push_many([entry("a0", "a.example"), entry("a1", "a.example")])
    assert len(queue.lease(2)) == 1
    client.delete(keys.inflight)  # the lease is gone, its ack will never come
    assert queue.lease(2) == []
    time.sleep(0.4)
    assert names(queue.lease(2)) == ["a1"]


def test_a_renewed_lease_keeps_its_site_slot(client: redis.Redis, prefix: str) -> None:
    policy = SitePolicy(limits=Limits(concurrency=1))
    queue = PriorityQueue(client, SpiderKeys.build("sites", prefix=prefix), 0.3, sites=policy)
    queue.push_many([entry("a0", "a.example"), entry("a1", "a.example")])
    held = queue.lease(2)
    for _ in range(3):
        time.sleep(0.15)
        assert queue.renew([held[0].member]) == 1
    assert queue.lease(2) == []


def test_a_shared_autothrottle_estimate_spaces_the_sites_leases(
    client: redis.Redis, prefix: str
) -> None:
    """AutoThrottle's formula on one estimate per site: latency 0.4 s at target 2 -> 0.2 s."""
    queue = queue_with(client, prefix, Limits())
    throttle = AutoThrottle(target=2.0, start=0.0, low=0.0, high=5.0)
    state = SiteState(client, queue.keys, SitePolicy(autothrottle=throttle))
    for _ in range(12):  # the estimate converges on latency / target
        state.success("a.example", 0.4, 200)
    reading = next(r for r in read_sites(client, queue.keys) if r.site == "a.example")
    assert 0.19 <= reading.delay <= 0.2
    state.success("a.example", 0.01, 503)  # not a 200: the estimate never drops on it
    assert next(r for r in read_sites(client, queue.keys)).delay >= 0.19
    queue.push_many([entry(f"a{i}", "a.example") for i in range(2)])
    assert names(queue.lease(2)) == ["a0"]
    assert queue.lease(2) == []
    assert queue.next_ready is not None and 0.15 < queue.next_ready <= 0.2


def test_a_success_ends_the_row_even_if_sent_before_the_back_off(
    client: redis.Redis, prefix: str
) -> None:
    """Scattered 429s among successes in flight never add up to a pause.

    Two requests pass the gate together; one answers 429, the other 200 after
    it. Ten such rounds are more than ``pause_after`` back-offs, but none in a row.
    """
    from scrapy.http import Response

    from celery_crawl.politeness.middleware import SiteLimitsMiddleware

    policy = SitePolicy(backoff=Backoff(first=0.001, pause_after=3, pause=300))
    state = SiteState(client, SpiderKeys.build("sites", prefix=prefix), policy)
    middleware = SiteLimitsMiddleware(state)
    url = "http://a.example/"
    for _ in range(10):
        middleware.process_response(Request(url), Response(url, status=429))
        middleware.process_response(Request(url), Response(url, status=200))
    site = state.read()["a.example"]
    assert site["backoffs"] == "10"
    assert site["strikes"] == "0"
    assert int(site["paused_ms"]) < 1000  # ten first back-offs of 1 ms, never the 300 s pause


def test_back_offs_with_no_success_between_pause_the_site(client: redis.Redis, prefix: str) -> None:
    from scrapy.http import Response

    from celery_crawl.politeness.middleware import SiteLimitsMiddleware

    policy = SitePolicy(backoff=Backoff(first=0.001, pause_after=3, pause=300))
    state = SiteState(client, SpiderKeys.build("sites", prefix=prefix), policy)
    middleware = SiteLimitsMiddleware(state)
    url = "http://a.example/"
    for _ in range(3):
        middleware.process_response(Request(url), Response(url, status=429))
    wait, strikes = state.gate("a.example")
    assert strikes == 3 and wait > 290_000


def test_a_damaged_parked_list_refuses_the_lease_before_any_pop(
    client: redis.Redis, prefix: str
) -> None:
    from celery_crawl.core.repair import repair

    queue = queue_with(client, prefix, Limits(concurrency=1))
    queue.push_many([entry(f"a{i}", "a.example") for i in range(3)])
    (a0,) = queue.lease(10)  # a1 and a2 parked
    parked = f"{queue.keys.parked}:a.example:0"
    assert client.llen(parked) == 2
    client.delete(parked)
    client.set(parked, "not a list")
    queue.ack([a0.member])  # the site is due again
    queue.push_many([entry("b0", "b.example")])
    with pytest.raises(redis.ResponseError, match=f"WRONGTYPE damaged key {parked}"):
        queue.lease(10)
    assert client.llen(queue.keys.level(0)) == 1  # b0 was not popped
    assert parked in repair(client, queue.keys).moved
    assert names(queue.lease(10)) == ["b0"]


def test_each_feedback_mode_argument_is_declared_once_and_read_by_name() -> None:
    """``FEEDBACK_MODES`` is the one layout of site_feedback.lua's modes: the script reads
    each argument by its name (from the generated table), and a caller's names must match."""
    from celery_crawl.core import scripts
    from celery_crawl.core.errors import ScriptError
    from celery_crawl.politeness.sites import FEEDBACK_MODES, mode_arguments

    code = re.sub(r"--.*", "", scripts.files("")["site_feedback"].read_text())
    read = set(re.findall(r"\ba\.(\w+)", code))
    assert read == {name for names in FEEDBACK_MODES.values() for name in names}
    assert "ARGV[4]" not in code and "MODE_ARGUMENTS[mode]" in code  # no index by hand
    assert set(re.findall(r"mode == '(\w+)'", code)) == set(FEEDBACK_MODES)
    backoff = Backoff().args(2.0)
    assert mode_arguments("backoff", backoff) == [2000, 1000, 60000, 8, 300000]
    assert mode_arguments("ok", {}) == []  # no AutoThrottle
    with pytest.raises(ScriptError, match="backoff takes retry_after_ms, first_ms"):
        mode_arguments("backoff", {**backoff, "extra": 1})
    with pytest.raises(ScriptError, match="robots takes crawl_delay_ms"):
        mode_arguments("robots", {})
