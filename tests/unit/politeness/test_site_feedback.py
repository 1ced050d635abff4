"""Server errors in ``politeness/lua/site_feedback.lua``, on a real server: a share, not each one.

Each request goes the real way: pushed, leased by the lease script (which
counts the site's leases), reported by the feedback script while it is still
held (as the middleware does, before the ack), then acked.
"""

from __future__ import annotations

import time

import pytest
import redis
from scrapy import Request
from scrapy.http import Response

from celery_crawl.core.entries import Entry, Lease
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.politeness.middleware import SiteLimitsMiddleware
from celery_crawl.politeness.sites import Backoff, Limits, Overload, SitePolicy, SiteState
from celery_crawl.queue.queues import PriorityQueue

pytestmark = pytest.mark.alone  # response windows and slowdowns timed by the server's clock

SITE = "a.example"
CAP = Limits(concurrency=1000)  # leases held are counted: a response is a lease that ended
QUICK = Overload(least=20, window=100)


class Site:
    """One site's queue and shared state; requests answered one by one, in order."""

    def __init__(self, client: redis.Redis, prefix: str, policy: SitePolicy) -> None:
        keys = SpiderKeys.build("sites", prefix=prefix)
        self.queue = PriorityQueue(client, keys, lease_seconds=60, sites=policy)
        self.state = SiteState(client, keys, policy)
        self.client, self.pushed = client, 0
        self.state.gate(SITE)  # the first download: the window starts

    def lease(self, count: int = 1) -> list[Lease]:
        entries = [Entry(f"r{self.pushed + i}".encode(), 0, None, "", SITE) for i in range(count)]
        self.pushed += count
        self.queue.push_many(entries)
        leases: list[Lease] = []
        for _ in range(500):  # bounded: a slowed site leases one per interval
            leases += self.queue.lease(count - len(leases))
            if len(leases) == count:
                return leases
            time.sleep(min(0.05, self.queue.next_ready or 0.001))
        raise AssertionError(f"{len(leases)} of {count} leased")

    def answer(self, statuses: str) -> list[int]:
        """One request per status, '.' a 200 and 'x' a 503 without Retry-After; for each
        503, the interval (ms) it slowed the site to (0: none)."""
        slowed = []
        for status in statuses:
            (lease,) = self.lease()
            if status == "x":
                slowed.append(self.state.server_error(SITE))
            self.queue.ack([lease.member])
        return slowed

    def fields(self) -> dict[str, str]:
        return self.state.read()[SITE]


def site_with(client: redis.Redis, prefix: str, overload: Overload = QUICK, **kw: object) -> Site:
    return Site(client, prefix, SitePolicy(limits=CAP, overload=overload, **kw))  # type: ignore[arg-type]


def test_isolated_server_errors_neither_slow_nor_pause_the_site(
    client: redis.Redis, prefix: str
) -> None:
    site = site_with(client, prefix, Overload())  # the defaults: 10% of at least 50
    slowed = site.answer(("." * 49 + "x") * 6)  # 2%
    assert slowed == [0] * 6
    fields = site.fields()
    assert fields["server_errors"] == "6"
    assert not {"slow", "delay", "slowdowns", "until", "backoffs"} & set(fields)
    site.queue.push_many([Entry(b"next", 0, None, "", SITE)])
    assert len(site.queue.lease(1)) == 1  # not held back


def test_server_errors_above_the_share_slow_every_lease_of_the_site(
    client: redis.Redis, prefix: str
) -> None:
    site = site_with(client, prefix)
    time.sleep(0.2)  # the window's 22 responses take at least 200 ms
    slowed = site.answer("." * 20 + "xxx")
    # 1 of 20, 2 of 21: isolated; 3 of 22 is more than 10%: the rate of the 19 others, less 10%
    assert slowed[:2] == [0, 0]
    assert slowed[2] >= 200 / (19 * 0.9)
    fields = site.fields()
    assert int(float(fields["slow"])) == int(fields["delay"]) == slowed[2]
    assert fields["slowdowns"] == "1" and "until" not in fields  # slowed, not paused
    site.queue.push_many([Entry(b"next", 0, None, "", SITE), Entry(b"then", 0, None, "", SITE)])
    assert len(site.queue.lease(2)) == 1
    assert site.queue.lease(2) == []  # the next is due one interval later
    assert site.queue.next_ready is not None and site.queue.next_ready > 0


def test_errors_of_requests_sent_before_a_slowdown_do_not_count_again(
    client: redis.Redis, prefix: str
) -> None:
    site = site_with(client, prefix)
    site.answer("." * 20)
    held = site.lease(10)  # in flight when the site is slowed
    assert site.answer("xxx")[-1] > 0
    assert [site.state.server_error(SITE) for _ in held] == [0] * 10  # old news
    site.queue.ack([lease.member for lease in held])
    assert site.answer("." * 18 + "xx") == [0, 0]  # 2 of 20: this window's own
    assert site.fields()["slowdowns"] == "1"


def test_the_window_forgets_old_responses(client: redis.Redis, prefix: str) -> None:
    """10% of the last 100 responses, not of all: a long clean run does not hide a burst."""
    site = site_with(client, prefix)
    site.answer("." * 300)
    slowed = site.answer("x" * 12)
    assert slowed[:10] == [0] * 10  # 10 of the last 100 are not more than 10%
    assert any(slowed[10:])


def test_a_slowdown_halves_until_it_ends(client: redis.Redis, prefix: str) -> None:
    site = site_with(client, prefix, Overload(least=20, recovery=0.05))
    slowed = site.answer("." * 20 + "xxx")[-1]
    assert slowed > 0
    time.sleep(0.05 * 12)  # 12 halvings: below 1 ms
    assert site.state.gate(SITE) == (0, 0)
    assert not {"slow", "delay"} & set(site.fields())
    assert site.fields()["slowdowns"] == "1"


def test_a_site_that_answers_only_errors_is_slowed_again_up_to_the_longest(
    client: redis.Redis, prefix: str
) -> None:
    backoff = Backoff(longest=0.1)
    site = site_with(client, prefix, backoff=backoff)
    slowed: list[int] = []
    for _ in range(4):  # bounded: each window of errors slows it further, up to 100 ms
        slowed += [ms for ms in site.answer("x" * 21) if ms]
        # slowed again, to the longest: a loaded machine's slow first window may reach it
        # at once (the interval follows the time the window took), so two at least
        if len(slowed) >= 2 and slowed[-1] == 100:
            break
    assert len(slowed) >= 2 and slowed == sorted(slowed) and slowed[-1] == 100
    assert "until" not in site.fields()


def test_a_429_or_a_5xx_with_retry_after_pauses_and_a_bare_5xx_is_counted(
    client: redis.Redis, prefix: str
) -> None:
    site = site_with(client, prefix, backoff=Backoff(first=0.001))
    middleware = SiteLimitsMiddleware(site.state)
    url = f"http://{SITE}/"
    for status in (500, 502, 503, 504):
        middleware.process_response(Request(url), Response(url, status=status))
    fields = site.fields()
    assert fields["server_errors"] == "4" and "backoffs" not in fields and "until" not in fields
    retry = {"Retry-After": "1"}
    middleware.process_response(Request(url), Response(url, status=503, headers=retry))
    assert 900 < site.state.gate(SITE)[0] <= 1000
    middleware.process_response(Request(url), Response(url, status=429))
    fields = site.fields()
    assert fields["backoffs"] == "2" and fields["server_errors"] == "4"
