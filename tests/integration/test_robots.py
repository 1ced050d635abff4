"""robots.txt with ``ROBOTSTXT_OBEY``: fetched once for four worker processes, its rules
obeyed by each, and its Crawl-delay held across them all (``politeness/robots.py``)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_crawl import crawl
from celery_crawl.core.keys import SpiderKeys
from tests.support.static_site import StaticSite, serve
from tests.support.waiting import wait_for_value
from tests.support.workers import Worker, started_workers

DELAY = 0.25  # the site's Crawl-delay: 4 requests a second, for every process together
ROBOTS = f"User-agent: *\nDisallow: /private/\nCrawl-delay: {DELAY}\n"
PAGES = 60


@pytest.fixture
def robots_site() -> Iterator[StaticSite]:
    with serve(StaticSite(pages=PAGES, robots=ROBOTS)) as site:
        yield site


@pytest.fixture
def four_processes(env: dict[str, str], tmp_path: Path) -> Iterator[list[Worker]]:
    # the site unlimited by the settings: only its robots.txt spaces its requests
    values = {**env, "SITE_CONCURRENCY": "0", "SITE_RATE": "0"}
    with started_workers(values, tmp_path) as start:
        # two workers of two processes each
        yield [start(name, pool="prefork", concurrency=2) for name in ("w1", "w2")]


def stats_of(
    client: redis.Redis, keys: SpiderKeys, forbidden: int, shared: int, timeout: float = 20
) -> dict[str, int]:
    """The crawl-wide robots.txt counters, once the processes' counts are all in (each
    process sends its counts in batches)."""

    def read() -> dict[str, int]:
        raw = client.hgetall(keys.stats)
        return {k.decode(): int(v) for k, v in raw.items() if k.startswith(b"robotstxt/")}

    def complete(found: dict[str, int]) -> bool:
        return (
            found.get("robotstxt/shared", 0) >= shared
            and found.get("robotstxt/forbidden", 0) >= forbidden
        )

    return wait_for_value(read, complete, timeout, "the robots.txt counters of every process")


def own_stats(output: str, spider: str) -> list[dict[str, int]]:
    """The counters of ``spider`` in each process of a stopped worker, from the stats each
    logs as its crawler closes."""
    dumps = re.findall(
        rf"\[{spider}\] Dumping Scrapy stats, this process only:\n(\{{.*?\}})\n", output, re.S
    )
    return [
        {name: int(value) for name, value in re.findall(r"'([^']+)': (\d+),?$", dump, re.M)}
        for dump in dumps
    ]


@pytest.mark.alone  # the spacing of a site's requests: a CPU of its own
def test_four_processes_fetch_robots_txt_once_and_hold_its_crawl_delay_together(
    app: Celery,
    prefix: str,
    state_client: redis.Redis,
    robots_site: StaticSite,
    four_processes: list[Worker],
) -> None:
    pages = [robots_site.url + path for path in robots_site.page_paths()]
    private = [f"{robots_site.url}/private/{n}.html" for n in range(5)]
    job = crawl("robots_pages", private + pages, app=app)  # the private ones read first
    result = job.wait(timeout=120)
    assert result["state"] == "done" and result["pages"] == PAGES, result
    # one fetch of robots.txt; every other process that crawled read the shared copy, once
    # (a process may get no request at all: the others take each due one first)
    assert robots_site.hits["/robots.txt"] == 1
    assert [worker.stop() for worker in four_processes] == [0, 0]
    own = [s for worker in four_processes for s in own_stats(worker.output(), "robots_pages")]
    assert len(own) == 4, own
    crawled = [s for s in own if s.get("downloader/request_count", 0) > 0]
    fetched = [s for s in crawled if s.get("robotstxt/request_count", 0) > 0]
    assert len(fetched) == 1 and fetched[0]["robotstxt/request_count"] == 1, own
    assert len(crawled) >= 2, own  # the shared copy was read
    assert all(s.get("robotstxt/shared") == 1 for s in crawled if s is not fetched[0]), own
    keys = SpiderKeys.build("robots_pages", prefix=prefix)
    stats = stats_of(state_client, keys, len(private), shared=len(crawled) - 1)
    assert stats.get("robotstxt/request_count") == 1, stats
    assert stats.get("robotstxt/shared") == len(crawled) - 1, stats
    # its rules, in every process: no disallowed page was fetched
    assert not any(path.startswith("/private/") for path in robots_site.hits)
    assert stats.get("robotstxt/forbidden") == len(private)
    # its Crawl-delay, across the four processes: the pages came no faster than it asks
    times = sorted(at for at, path in robots_site.arrivals if path.startswith("/page/"))
    assert len(times) == PAGES
    span = times[-1] - times[0]
    assert span >= (PAGES - 1) * DELAY * 0.95, span
    # and never in bursts: at most one more than the delay allows in any second
    for first, _ in enumerate(times):
        in_a_second = sum(1 for t in itertools.islice(times, first, None) if t < times[first] + 1)
        assert in_a_second <= 1 / DELAY + 1, (first, times)
