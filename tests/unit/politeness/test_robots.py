"""robots.txt shared through Redis (``politeness/robots.py``), on a real server: one fetch
claimed for all, a lapsed claim taken over, a failed fetch shared, the Crawl-delay paced."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from protego import Protego
from scrapy.http import Request
from scrapy.robotstxt import ProtegoRobotParser
from twisted.internet.defer import Deferred, ensureDeferred

from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys, robots_key
from celery_crawl.politeness.robots import SharedRobots, SharedRobotsTxtMiddleware, crawl_delay
from celery_crawl.politeness.sites import SiteState

HOST = "forum.example:8000"
RULES = b"User-agent: *\nDisallow: /private/\nCrawl-delay: 120\n"


class HeldDownload(SharedRobotsTxtMiddleware):
    """The middleware, its robots.txt download (the network) held until the test
    answers it; the claim, the copy in Redis and the parsing are the real ones."""

    downloads: list[Deferred[bytes | None]]

    async def _fetch(self, request: Request) -> bytes | None:
        self.downloads.append(Deferred())
        return await self.downloads[-1]


def held(make_crawler: Any, **settings: Any) -> HeldDownload:
    from twisted.internet import reactor  # noqa: F401  Scrapy's signals ask which is installed

    middleware = HeldDownload.from_crawler(make_crawler(ROBOTSTXT_OBEY=True, **settings))
    middleware.downloads = []
    return middleware


def parsers_of(middleware: HeldDownload, paths: list[str]) -> list[Any]:
    """``robot_parser`` for each path, all started before any returns; their results."""
    results: list[Any] = []
    for path in paths:
        request = Request(f"http://{HOST}{path}")
        ensureDeferred(middleware.robot_parser(request)).addBoth(results.append)
    return results


def test_one_process_fetches_the_others_wait_then_read_its_copy(
    client: redis.Redis, prefix: str
) -> None:
    first, second = SharedRobots(client, prefix, 60), SharedRobots(client, prefix, 60)
    assert first.claim(HOST) == ("fetch", None, 0)
    assert second.claim(HOST) == ("wait", None, 0)  # the claim holds
    first.store(HOST, b"User-agent: *\nDisallow: /private/\n")
    outcome, body, seconds = second.claim(HOST)
    assert (outcome, body) == ("body", b"User-agent: *\nDisallow: /private/\n")
    assert 59 < seconds <= 60  # the reader keeps its copy as long as Redis does, no longer
    assert 0 < client.ttl(robots_key(prefix, HOST)) <= 60  # for ROBOTSTXT_SHARED_SECONDS


def test_a_failed_fetch_is_shared_for_a_while_and_a_lapsed_claim_is_taken_over(
    client: redis.Redis, prefix: str
) -> None:
    first, second = SharedRobots(client, prefix, 86400), SharedRobots(client, prefix, 86400)
    assert first.claim(HOST)[0] == "fetch"
    client.hset(robots_key(prefix, HOST), "claim_until", 0)  # its process died long ago
    assert second.claim(HOST) == ("fetch", None, 0)
    second.store(HOST, None)  # the download failed: every process obeys nothing for a while
    outcome, body, seconds = first.claim(HOST)
    assert (outcome, body) == ("body", None) and 0 < seconds <= 300  # not for a day
    assert 0 < client.ttl(robots_key(prefix, HOST)) <= 300
    client.set(robots_key(prefix, HOST), "garbage")  # a key of another type: a cache, replaced
    assert first.claim(HOST) == ("fetch", None, 0)


def test_every_request_waiting_on_one_read_gets_the_parser(
    make_crawler: Any, client: redis.Redis, prefix: str
) -> None:
    middleware = held(make_crawler)
    results = parsers_of(middleware, ["/private/1", "/private/2", "/private/3", "/a"])
    assert results == [] and len(middleware.downloads) == 1  # one download, four waiting
    middleware.downloads[0].callback(RULES)
    assert len(results) == 4
    assert all(not parser.allowed(f"http://{HOST}/private/1", "Scrapy") for parser in results)
    assert client.hget(robots_key(prefix, HOST), "ok") == b"1"  # and shared
    # the Crawl-delay of 120 s, capped by ROBOTSTXT_CRAWL_DELAY_MAX (60 s)
    assert middleware.crawler.stats.get_value("robotstxt/crawl_delay_capped") == 1
    site = SpiderKeys.from_settings("forum", middleware.crawler.settings).site("forum.example")
    assert client.hget(site, "robots") == b"60000"


def test_a_failed_read_leaves_no_request_waiting(make_crawler: Any) -> None:
    middleware = held(make_crawler)
    results = parsers_of(middleware, ["/a", "/b"])
    middleware.downloads[0].errback(ValueError("a parser that cannot read it"))
    assert results == [None, None]  # obey nothing, as Scrapy does, and wait no more
    assert middleware.crawler.stats.get_value("robotstxt/shared_errors") == 1
    assert parsers_of(middleware, ["/c"]) == [None]  # kept a while, not read again at once
    assert len(middleware.downloads) == 1


def test_a_refusing_redis_fetches_for_this_process_alone(make_crawler: Any) -> None:
    # nothing listens there; the counts kept in memory, where they can be read
    stats = "scrapy.statscollectors.MemoryStatsCollector"
    middleware = held(make_crawler, REDIS_URL="redis://127.0.0.1:9/0", STATS_CLASS=stats)
    results = parsers_of(middleware, ["/private/1", "/private/2"])
    middleware.downloads[0].callback(RULES)
    assert len(results) == 2
    assert all(not parser.allowed(f"http://{HOST}/private/1", "Scrapy") for parser in results)
    assert middleware.crawler.stats.get_value("robotstxt/shared_errors") >= 1
    # its Crawl-delay (120 s, capped at 60) still spaces this process's downloads
    waits = [middleware._pace("forum.example") for _ in range(3)]
    # (each try to reach Redis takes a moment off the waits)
    assert waits[0] == 0 and 55 < waits[1] <= 60 and 110 < waits[2] <= 120, waits


def test_a_cancelled_read_is_read_again_not_kept_as_obey_nothing(make_crawler: Any) -> None:
    middleware = held(make_crawler)
    reading = ensureDeferred(middleware.robot_parser(Request(f"http://{HOST}/a")))
    reading.addErrback(lambda failure: None)
    reading.cancel()  # Twisted's CancelledError, an Exception
    assert parsers_of(middleware, ["/b"]) == []  # not "obey nothing": a read again
    assert len(middleware.downloads) == 2


def test_the_sharing_settings_are_checked(make_crawler: Any) -> None:
    with pytest.raises(ConfigError, match="ROBOTSTXT_SHARED_SECONDS"):
        held(make_crawler, ROBOTSTXT_SHARED_SECONDS=0)
    with pytest.raises(ConfigError, match="ROBOTSTXT_CRAWL_DELAY_MAX"):
        held(make_crawler, ROBOTSTXT_CRAWL_DELAY_MAX=-1)


def test_the_crawl_delay_spaces_downloads_of_every_process_and_none_lifts_it(
    client: redis.Redis, prefix: str
) -> None:
    sites = SiteState(client, SpiderKeys.build("robots", prefix=prefix))
    assert sites.pace("a.example") == 0  # no Crawl-delay: at once
    sites.crawl_delay("a.example", 0.5)
    calls = [timed(lambda: sites.pace("a.example")) for _ in range(3)]  # three processes
    # each call's slot (when it was asked, plus the wait it got), 500 ms after the one before;
    # a call is asked somewhere between the times before and after it (a loaded machine)
    first_before, first_after, first_wait = calls[0]
    assert first_wait <= 5, calls
    for k, (before, after, wait) in enumerate(calls[1:], start=1):
        earliest, latest = (
            before + wait - (first_after + first_wait),
            after + wait - (first_before + first_wait),
        )
        assert earliest <= 500 * k + 5 and latest >= 500 * k - 10, (k, calls)
    assert client.hget(SpiderKeys.build("robots", prefix=prefix).site("a.example"), "robots")
    sites.crawl_delay("a.example", None)
    assert sites.pace("a.example") == 0


def test_the_crawl_delay_is_read_for_the_user_agent() -> None:
    body = b"User-agent: slowbot\nCrawl-delay: 7\n\nUser-agent: *\nCrawl-delay: 2\n"
    parser = ProtegoRobotParser.__new__(ProtegoRobotParser)
    parser.rp = Protego.parse(body.decode())
    assert crawl_delay(parser, "slowbot") == 7.0
    assert crawl_delay(parser, "Scrapy/2.19") == 2.0
    assert crawl_delay(object(), "any") is None  # a parser that cannot tell


def timed(call: Callable[[], int]) -> tuple[float, float, int]:
    """(ms before, ms after, what ``call`` returned), on this process's monotonic clock."""
    before = time.monotonic() * 1000
    result = call()
    return before, time.monotonic() * 1000, result
