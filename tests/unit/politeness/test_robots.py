"""robots.txt shared through Redis (``politeness/robots.py``), on a real server: one fetch
claimed for all, a lapsed claim taken over, a failed fetch shared, the Crawl-delay paced."""

from __future__ import annotations

import redis
from protego import Protego
from scrapy.robotstxt import ProtegoRobotParser

from celery_crawl.core.keys import SpiderKeys, robots_key
from celery_crawl.politeness.robots import SharedRobots, crawl_delay
from celery_crawl.politeness.sites import SiteState

HOST = "forum.example:8000"


def test_one_process_fetches_the_others_wait_then_read_its_copy(
    client: redis.Redis, prefix: str
) -> None:
    first, second = SharedRobots(client, prefix, 60), SharedRobots(client, prefix, 60)
    assert first.claim(HOST) == ("fetch", None)
    assert second.claim(HOST) == ("wait", None)  # the claim holds
    first.store(HOST, b"User-agent: *\nDisallow: /private/\n")
    assert second.claim(HOST) == ("body", b"User-agent: *\nDisallow: /private/\n")
    assert 0 < client.ttl(robots_key(prefix, HOST)) <= 60  # for ROBOTSTXT_SHARED_SECONDS


def test_a_failed_fetch_is_shared_for_a_while_and_a_lapsed_claim_is_taken_over(
    client: redis.Redis, prefix: str
) -> None:
    first, second = SharedRobots(client, prefix, 86400), SharedRobots(client, prefix, 86400)
    assert first.claim(HOST)[0] == "fetch"
    client.hset(robots_key(prefix, HOST), "claim_until", 0)  # its process died long ago
    assert second.claim(HOST) == ("fetch", None)
    second.store(HOST, None)  # the download failed: every process obeys nothing for a while
    assert first.claim(HOST) == ("body", None)
    assert 0 < client.ttl(robots_key(prefix, HOST)) <= 300
    client.set(robots_key(prefix, HOST), "garbage")  # a key of another type: a cache, replaced
    assert first.claim(HOST) == ("fetch", None)


def test_the_crawl_delay_spaces_downloads_of_every_process_and_none_lifts_it(
    client: redis.Redis, prefix: str
) -> None:
    sites = SiteState(client, SpiderKeys.build("robots", prefix=prefix))
    assert sites.pace("a.example") == 0  # no Crawl-delay: at once
    sites.crawl_delay("a.example", 0.5)
    waits = [sites.pace("a.example") for _ in range(3)]  # three processes, at once
    assert waits[0] <= 5 and 490 <= waits[1] <= 505 and 990 <= waits[2] <= 1005, waits
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
