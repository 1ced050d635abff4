"""Several plain `scrapy crawl` processes on one queue, with the scheduler's defaults.

The process that seeds holds the lease of `/` while the test starts a second
one: the queue is empty, yet work is still coming (see tests/support/site_crawl.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_crawl.core.keys import SpiderKeys
from celery_crawl.queue.queues import PriorityQueue
from tests.support.site_crawl import SPIDER
from tests.support.static_site import StaticSite, serve
from tests.support.waiting import wait_for
from tests.support.workers import Process, start_process

TIMEOUT = 300.0


@pytest.fixture
def site() -> Iterator[StaticSite]:
    with serve(StaticSite()) as running:
        yield running


def start(tmp_path: Path, name: str, args: list[str]) -> Process:
    log = tmp_path / f"{name}.log"
    return start_process("tests.support.site_crawl", args, dict(os.environ), log)


def first_to_exit(procs: list[Process]) -> Process:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                return proc
        time.sleep(0.05)
    raise AssertionError("no crawl process exited")


def urls(feed: Path) -> list[str]:
    lines = feed.read_text().splitlines() if feed.exists() else []
    return [json.loads(line)["url"] for line in lines if line]


class Crawl:
    """The site, the queue of its spider, and a held seeding process started on them."""

    def __init__(self, site: StaticSite, redis_url: str, prefix: str, tmp_path: Path) -> None:
        self.site, self.tmp_path = site, tmp_path
        self.base = [redis_url, prefix, site.url]
        self.keys = SpiderKeys.build(SPIDER, prefix=prefix)
        self.hold = tmp_path / "hold"
        self.hold.touch()

    def seeder(self, queue: PriorityQueue) -> Process:
        feed = str(self.tmp_path / "a.jsonl")
        proc = start(self.tmp_path, "a", [*self.base, feed, "--seed", "--hold", str(self.hold)])
        held = lambda: queue.pending() == (0, 1) and self.site.hits["/"] == 1  # noqa: E731
        wait_for(held, 120, "the seeding process holds the lease of /")
        return proc

    def consumer(self, *settings: str) -> Process:
        sets = [arg for pair in settings for arg in ("--set", pair)]
        proc = start(self.tmp_path, "b", [*self.base, str(self.tmp_path / "b.jsonl"), *sets])
        opened = lambda: "Spider opened" in self.log("b")  # noqa: E731
        wait_for(opened, 120, "the second process opened its spider")
        return proc

    def log(self, name: str) -> str:
        path = self.tmp_path / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def assert_every_page_fetched_once(self) -> None:
        expected = {"/", *self.site.page_paths()}
        assert set(self.site.hits) == expected
        assert set(self.site.hits.values()) == {1}, "a page was fetched twice"


@pytest.fixture
def crawl(site: StaticSite, redis_url: str, prefix: str, tmp_path: Path) -> Crawl:
    return Crawl(site, redis_url, prefix, tmp_path)


def test_a_process_started_while_the_queue_is_empty_waits_and_crawls(
    crawl: Crawl, client: redis.Redis
) -> None:
    queue = PriorityQueue(client, crawl.keys)
    seeder = crawl.seeder(queue)
    late = crawl.consumer()
    time.sleep(3)  # long enough for several idle checks
    assert late.poll() is None, f"closed with a lease held elsewhere:\n{crawl.log('b')[-2000:]}"
    crawl.hold.unlink()
    first = first_to_exit([seeder, late])
    assert len(crawl.site.hits) == 1 + crawl.site.pages, "a process exited with work to do"
    for proc in (seeder, late):
        assert proc.wait(timeout=TIMEOUT) == 0, crawl.log("a" if proc is seeder else "b")[-3000:]
    crawl.assert_every_page_fetched_once()
    fetched = [urls(crawl.tmp_path / f"{name}.jsonl") for name in ("a", "b")]
    assert all(fetched), "both processes took part"
    assert sum(map(len, fetched)) == len({u for f in fetched for u in f}) == 1 + crawl.site.pages
    assert first.returncode == 0
    # the defaults do not persist: the last process to close cleared queue and dedup
    assert queue.pending() == (0, 0)
    assert not client.keys(f"{crawl.keys.dupefilter}*")
    assert not client.exists(crawl.keys.open_schedulers)


def test_without_persist_the_dedup_set_lives_until_the_last_process_closes(
    crawl: Crawl, client: redis.Redis
) -> None:
    queue = PriorityQueue(client, crawl.keys)
    seeder = crawl.seeder(queue)
    early = crawl.consumer("CLOSESPIDER_TIMEOUT=3")  # gives up before the crawl ends
    assert early.wait(timeout=120) == 0
    assert "closespider_timeout" in crawl.log("b")
    assert seeder.poll() is None
    assert client.get(crawl.keys.dupefilter_count) == b"1", "the first to close kept the dedup"
    assert client.zcard(crawl.keys.open_schedulers) == 1
    assert "1 other process(es) still have them open" in crawl.log("b")
    crawl.hold.unlink()
    assert seeder.wait(timeout=TIMEOUT) == 0, crawl.log("a")[-3000:]
    crawl.assert_every_page_fetched_once()
    assert not client.keys(f"{crawl.keys.dupefilter}*"), "the last to close cleared the dedup"
    assert queue.pending() == (0, 0)
