"""The hit-expiring filter (``dedup_hits.lua``) on a real server: a fingerprint lives as long
as its source's crawls link to it, and N crawls more; each source counts its own crawls."""

from __future__ import annotations

import pytest
import redis

from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.dupefilter.filters import HitExpiringDupeFilter, HitsParams
from celery_crawl.queue.queues import Base, PriorityQueue
from tests.support.source_crawls import crawl_source

LISTING = b"listing"  # each crawl's seed: not filtered, as Scrapy's start requests


def post(n: int) -> bytes:
    return b"post-%02d" % n + b"." * 12  # a 20-byte fingerprint


class Forum:
    """Crawls of sources: a job with the source's listing, whose posts are its children."""

    def __init__(self, client: redis.Redis, prefix: str, crawls: int) -> None:
        keys = SpiderKeys.build("forum", prefix=prefix)
        self.filter = HitExpiringDupeFilter(client, keys, None, params=HitsParams(crawls=crawls))
        self.queue: Base = PriorityQueue(
            client, keys, dedup=self.filter.script, dedup_scope="spider"
        )
        self.jobs = 0

    def crawl(self, source: str, posts: list[int]) -> list[bool]:
        """One crawl of ``source`` that links ``posts``: which of them are new (fetched)."""
        self.jobs += 1
        return crawl_source(self.queue, f"{source}-{self.jobs}", source, [post(n) for n in posts])


def test_a_post_lives_while_linked_and_is_forgotten_n_crawls_after_the_last_link(
    client: redis.Redis, prefix: str
) -> None:
    forum = Forum(client, prefix, crawls=2)
    assert forum.crawl("board", [1, 2, 3]) == [True, True, True]
    assert forum.crawl("board", [2, 3, 4]) == [False, False, True]  # the listing rolls
    assert forum.crawl("board", [3, 4, 5]) == [False, False, True]
    assert len(forum.filter) == 5  # post 1, unlinked for two crawls, is still known
    # crawl 4: post 1 was last linked by crawl 1, three crawls back: forgotten (fetched
    # again if it shows up); post 2, linked by crawl 2, is not
    assert forum.crawl("board", [1, 2]) == [True, False]
    assert len(forum.filter) == 5  # 1, 2, 3, 4, 5; the set of crawl 1 deleted whole
    assert not client.exists(f"{forum.filter.keys.dupefilter}:h:board:1")


def test_a_post_linked_at_every_crawl_is_never_fetched_twice(
    client: redis.Redis, prefix: str
) -> None:
    forum = Forum(client, prefix, crawls=1)
    assert forum.crawl("board", [7]) == [True]
    for _ in range(10):  # however many crawls: each link is a hit that keeps it
        assert forum.crawl("board", [7]) == [False]
    assert len(forum.filter) == 1


def test_each_source_counts_its_own_crawls(client: redis.Redis, prefix: str) -> None:
    """A busy source crawled often does not make a quiet one forget."""
    forum = Forum(client, prefix, crawls=1)
    assert forum.crawl("quiet", [1]) == [True]
    for n in range(5):
        forum.crawl("busy", [100 + n])
    assert forum.crawl("quiet", [1]) == [False]  # quiet's second crawl: still known
    assert forum.crawl("busy", [1]) == [True]  # and each source's fingerprints are its own


def test_the_number_of_crawls_is_checked_and_stored(client: redis.Redis, prefix: str) -> None:
    with pytest.raises(ConfigError, match="DUPEFILTER_EXPIRE_CRAWLS"):
        HitsParams(crawls=0)
    forum = Forum(client, prefix, crawls=3)
    forum.crawl("board", [1])
    assert forum.filter.stored_params() == {"crawls": "3"}


def test_a_damaged_crawl_count_is_repaired_before_the_job_writes(
    client: redis.Redis, prefix: str
) -> None:
    """Redis holding garbage: the start is refused whole, the key moved aside, and the
    start sent again; never half-written, even when no seed meets the filter (Scrapy's
    dont_filter seeds)."""
    forum = Forum(client, prefix, crawls=2)
    crawls = f"{forum.filter.keys.dupefilter}:crawls"
    client.set(crawls, "garbage")
    seed = [Entry(LISTING, 0, None, "j")]
    assert forum.queue.start_job("j", seed, {"spider": "forum", "source": "board"})[0]
    assert client.get(crawls + "~damaged") == b"garbage"  # kept aside, to look at
    assert client.hget(crawls, "board") == b"1"
    client.hset(crawls, "board", "not a number")  # a field of text: counted from 0
    assert forum.queue.start_job("k", seed, {"spider": "forum", "source": "board"})[0]
    assert client.hget(crawls, "board") == b"1"


def test_requests_routed_to_another_spider_of_the_group_are_forgotten_too(
    client: redis.Redis, prefix: str
) -> None:
    """The vertical split: a job of ``forum`` sends its posts to ``forum_detail``'s queue,
    whose filter counts the job's source's crawls as well."""
    script = HitExpiringDupeFilter(client, SpiderKeys.build("forum", prefix=prefix), None).script
    group = [
        SpiderKeys.build("forum", prefix=prefix),
        SpiderKeys.build("forum_detail", group="forum", prefix=prefix),
    ]
    forum, detail = (
        PriorityQueue(client, keys, dedup=script, dedup_scope="spider") for keys in group
    )

    def crawl(number: int, posts: list[int]) -> list[bool]:
        job = f"j{number}"
        fields = {"spider": "forum", "source": "board"}
        forum.start_job(job, [Entry(LISTING, 0, None, job)], fields, group)
        (seed,) = forum.lease(1)
        routed = [Entry(b"p", 0, post(n), job) for n in posts]
        flags = forum.push_many([], acks=[seed.member], routed=[(detail, routed)])
        while leases := detail.lease(100):
            detail.ack([lease.member for lease in leases])
        return flags

    assert crawl(1, [1, 2]) == [True, True]
    for number in range(2, 6):  # HitsParams' default: 5 crawls
        crawl(number, [2])
    assert crawl(6, [2]) == [False]
    assert crawl(7, [1, 2]) == [True, False]  # post 1: 6 crawls unlinked, forgotten
    assert client.hget(f"{group[1].dupefilter}:crawls", "board") == b"7"


def test_n_is_stored_by_the_first_write_even_when_a_check_read_it_first(
    client: redis.Redis, prefix: str
) -> None:
    keys = SpiderKeys.build("forum", prefix=prefix)
    dedup = HitExpiringDupeFilter(client, keys, None, params=HitsParams(crawls=4))
    assert dedup.add_fingerprints([post(1)]) == [True]  # no process opened it before
    assert client.hget(f"{keys.dupefilter}:hits", "crawls") == b"4"
