"""Per-site limits shared by four worker processes, measured at the sites themselves.

Two demo sites on loopback: ``127.0.0.1`` limited to 10 requests/s and 4 in
flight (SITE_OVERRIDES), ``127.0.0.2`` unlimited. Real Celery workers host the
``site_pages`` spider; the sites log every arrival. Server errors: ``127.0.0.3``
answers 2% of requests 503 at random, ``127.0.0.4`` answers 503 above 40
requests per second; both have no rate of their own, and 8 in flight.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

import pytest
import redis
from celery import Celery

from celery_crawl import crawl
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.demo.site import Arrival, SiteConfig, SiteThread
from celery_crawl.politeness.middleware import GATE_SECONDS
from celery_crawl.tools.status import snapshot
from tests.support.machine_share import IDLE_OTHERS
from tests.support.workers import Worker, started_workers

# rates and spans measured at the sites, with four workers, first for the CPUs (alone, the
# others idle; without the right to idle them, an alone test would have one CPU, too few:
# the whole machine then); a failed measurement taken again, twice at most
# (pytest-rerunfailures; reruns are listed)
pytestmark = [pytest.mark.alone(machine=not IDLE_OTHERS), pytest.mark.flaky(reruns=2)]
# a fast crawl beside a limited one, as fast as alone: the whole machine (on one CPU, pinned,
# it failed its first run in most suite runs; beside tests run idle, often)
WHOLE_MACHINE = pytest.mark.alone(machine=True)

LIMITED = {"concurrency": 4, "rate": 10, "burst": 1}
CONFIG = SiteConfig(forums=30, posts_per_forum=100)  # 3,000 post pages
FLAKY = SiteConfig(forums=10, posts_per_forum=100, error_rate=0.02)  # 1,000 pages
CAPACITY = 40  # requests per second the overloaded site answers; 503 to the others
OVERLOADED = SiteConfig(forums=6, posts_per_forum=100, rate_limit=CAPACITY, rate_limit_status=503)


@pytest.fixture
def two_sites() -> Iterator[tuple[SiteThread, SiteThread]]:
    with (
        SiteThread(CONFIG, host="127.0.0.1").start() as limited,
        SiteThread(CONFIG, host="127.0.0.2").start() as free,
    ):
        yield limited, free


@pytest.fixture
def politeness_env(env: dict[str, str]) -> dict[str, str]:
    return {
        **env,
        "SITE_CONCURRENCY": "0",  # sites are unlimited unless named (the forum app's
        "SITE_RATE": "0",  # own SITE_RATE would hold the other site to 200 requests/s)
        "SITE_OVERRIDES": json.dumps({"127.0.0.1": LIMITED}),
    }


@pytest.fixture
def four_workers(politeness_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with started_workers(politeness_env, tmp_path) as start:
        for name in ("w1", "w2"):  # two workers of two processes each
            start(name, pool="prefork", concurrency=2)
        yield start


@pytest.fixture
def server_error_workers(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    # 8 in flight, no rate: only the server errors slow these sites
    capped = {"concurrency": 8, "rate": 0}
    overrides = json.dumps({"127.0.0.3": capped, "127.0.0.4": capped})
    values = {**env, "SITE_CONCURRENCY": "0", "SITE_RATE": "0", "SITE_OVERRIDES": overrides}
    with started_workers(values, tmp_path) as start:
        for name in ("w1", "w2"):  # two workers of two processes each
            start(name, pool="prefork", concurrency=2)
        yield start


def keys_of(prefix: str) -> SpiderKeys:
    return SpiderKeys.build("site_pages", prefix=prefix)


def pages(site: SiteThread, first: int, count: int) -> list[str]:
    return [f"{site.url}/post/{post}" for post in CONFIG.post_ids()[first : first + count]]


def most_in_one_second(arrivals: list[Arrival]) -> int:
    """The most arrivals in any window [t, t + 1 s) that starts at an arrival."""
    times = sorted(a.started for a in arrivals)
    most, end = 0, 0
    for start, at in enumerate(times):
        while end < len(times) and times[end] < at + 1.0:
            end += 1
        most = max(most, end - start)
    return most


def span(arrivals: list[Arrival]) -> float:
    times = [a.started for a in arrivals]
    return max(times) - min(times)


def crawl_alone(app: Celery, site: SiteThread) -> list[Arrival]:
    run(app, {"alone": pages(site, 0, 2400)})
    assert site.wait_idle()
    return take_log(site)


def crawl_beside(
    app: Celery, limited: SiteThread, free: SiteThread, slow_pages: int
) -> tuple[list[Arrival], list[Arrival]]:
    """One job on each site at once: the limited site's arrivals, then the free one's."""
    done = run(app, {"limited": pages(limited, 0, slow_pages), "free": pages(free, 0, 2400)})
    assert done["limited"]["state"] == done["free"]["state"] == "done"
    assert limited.wait_idle() and free.wait_idle()
    return take_log(limited), take_log(free)


def take_log(site: SiteThread) -> list[Arrival]:
    arrivals = site.arrivals()
    site.reset_log()
    return arrivals


def run(app: Celery, jobs: dict[str, list[str]], timeout: float = 120) -> dict[str, Any]:
    started = {name: crawl("site_pages", seeds, app=app) for name, seeds in jobs.items()}
    return {name: job.wait(timeout=timeout) for name, job in started.items()}


def assert_held(slow: list[Arrival], limited: SiteThread) -> None:
    # The limit grants 10 a second (burst 1) by the server's clock; the site sees arrivals,
    # each a little after its grant. On the 2-core machine, four workers and the free site's
    # crawl share the CPU (this test runs alone), and a busy reactor sends a granted request
    # up to a few tenths of a second late, so late ones join the next second's ten (CI saw
    # 12). 13 allows that and still fails a limit held per process (40/s); the burst setting
    # itself is the unit tests' (tests/unit/politeness/test_sites.py). The mean rate: 100
    # pages at 10 a second take 9.9 s at the least.
    most = most_in_one_second(slow)
    assert most <= 13, f"{most} requests in one second"
    assert span(slow) >= 9.0, f"100 pages in {span(slow):.2f} s"
    assert limited.max_in_flight <= 4


@WHOLE_MACHINE
def test_four_workers_hold_a_site_to_its_limits_and_crawl_another_at_full_speed(
    app: Celery,
    prefix: str,
    state_client: redis.Redis,
    two_sites: tuple[SiteThread, SiteThread],
    four_workers: Callable[..., Worker],
) -> None:
    limited, free = two_sites
    run(app, {"warm": pages(free, 0, 50) + pages(limited, 0, 5)})  # every process joined
    for site in two_sites:
        assert site.wait_idle()
        site.reset_log()

    # The free site alone and beside the limited one, in turn: 5 crawls beside it between
    # 6 alone, so that the machine's drift over the test spreads over both kinds.
    alone = [crawl_alone(app, free)]
    slow, fast = crawl_beside(app, limited, free, slow_pages=100)
    assert len(slow) == 100 and len(fast) == 2400
    assert_held(slow, limited)
    print(f"limited site: 100 pages in {span(slow):.2f} s")
    # 100 pages at 10/s: the limit held them (9.9 s at the least), and they had it. The
    # upper bound is the limit less a quarter: on the 2-core machine the code before the
    # packages took 11.9 and 12.2 s here, four workers' wake-ups contending for the CPU
    # (throughput itself is the benchmarks' to measure, not a test's)
    assert 9.0 <= span(slow) <= 13.2
    assert span(fast) < span(slow)  # the fast site finished while the slow one was crawled
    beside = [fast]
    for _ in range(4):
        alone.append(crawl_alone(app, free))
        # 100 limited pages (10 s), so that the 2,400 free ones fit beside them with room
        # on a slow machine (50 left a margin of a tenth of a second there)
        slow, fast = crawl_beside(app, limited, free, slow_pages=100)
        assert_held(slow, limited)
        assert span(fast) < span(slow)  # the whole fast crawl ran beside the limited one
        print(f"limited site: 100 pages in {span(slow):.2f} s")
        beside.append(fast)
    alone.append(crawl_alone(app, free))

    assert all(len(arrivals) == 2400 for arrivals in alone + beside)
    # the unlimited site, crawled beside the limited one, as fast as alone (within 10%)
    by_itself = median(span(arrivals) for arrivals in alone)
    next_to_it = median(span(arrivals) for arrivals in beside)
    spans = {"alone": [span(a) for a in alone], "beside": [span(a) for a in beside]}
    print(f"unlimited site, median: {by_itself:.2f} s alone, {next_to_it:.2f} s beside; {spans}")
    assert next_to_it <= 1.10 * by_itself, spans
    # celery-crawl status shows the limited site, its requests that waited for the limits
    sites = {row["site"]: row for row in snapshot(state_client, [keys_of(prefix)], app)["sites"]}
    assert sites["127.0.0.1"]["leased"] >= 300 and sites["127.0.0.1"]["parked"] > 0
    assert sites["127.0.0.1"]["backoffs"] == 0 and sites["127.0.0.2"]["parked"] == 0


def test_a_retry_after_seen_by_one_worker_holds_back_every_worker(
    app: Celery,
    prefix: str,
    state_client: redis.Redis,
    two_sites: tuple[SiteThread, SiteThread],
    four_workers: Callable[..., Worker],
) -> None:
    _, site = two_sites  # unlimited: only the Retry-After slows it
    run(app, {"warm": pages(site, 0, 50)})
    assert site.wait_idle()
    site.reset_log()
    site.answer_429(count=1, retry_after=2)
    result = run(app, {"paused": pages(site, 0, 400)})["paused"]
    assert site.wait_idle()
    arrivals = sorted(site.arrivals(), key=lambda a: a.started)

    refused = [a for a in arrivals if a.status == 429]
    assert len(refused) == 1 and result["state"] == "done"
    # when the worker that got the 429 paused the site for every process (server clock)
    key = keys_of(prefix).site("127.0.0.2")
    paused_at = int(state_client.hget(key, "backoff_at") or 0) / 1000
    assert refused[0].started <= paused_at < refused[0].started + 1.0
    # a pause reaches another process within GATE_SECONDS (25 ms); a request that passed its
    # gate just before is still on its way to the site: under two CPU hogs, such requests
    # arrived 50 to 59 ms after the pause, and in CI 100 and 124 ms after it, each time in
    # one burst (a process's reactor that had stalled). With both gates removed (the lease's
    # and the downloader's), 128 to 209 requests came from 250 ms on: that is what this finds
    grace = 10 * GATE_SECONDS
    during = [a for a in arrivals if paused_at + grace < a.started < refused[0].started + 2.0]
    offsets = [round(a.started - paused_at, 3) for a in during]  # when, after the pause
    assert not during, f"{len(during)} requests within the 2 s of Retry-After, at {offsets} s"
    after = [a for a in arrivals if a.started >= refused[0].started + 2.0]
    assert after and {a.status for a in after} <= {200, 404}  # then on, the retry included
    assert len(arrivals) == 401  # every page once, and the refused one again


def site_fields(client: redis.Redis, prefix: str, site: str) -> dict[str, str]:
    values = client.hgetall(keys_of(prefix).site(site))
    return {k.decode(): v.decode() for k, v in values.items()}


def crawl_site(app: Celery, config: SiteConfig, host: str) -> tuple[dict[str, Any], list[Arrival]]:
    with SiteThread(config, host=host).start() as site:
        urls = [f"{site.url}/post/{post}" for post in config.post_ids()]
        result = run(app, {host: urls}, timeout=240)[host]
        assert site.wait_idle()
        return result, sorted(site.arrivals(), key=lambda a: a.started)


def test_sporadic_503s_are_retried_and_neither_pause_nor_slow_the_site(
    app: Celery,
    prefix: str,
    state_client: redis.Redis,
    server_error_workers: Callable[..., Worker],
) -> None:
    result, arrivals = crawl_site(app, FLAKY, "127.0.0.3")
    refused = [a for a in arrivals if a.status == 503]
    answered = {a.path for a in arrivals if a.status != 503}
    print(f"flaky site: {len(arrivals)} requests, {len(refused)} 503s")
    assert result["state"] == "done"
    assert refused  # 2% of about 1,000
    assert len(answered) >= 0.99 * len(FLAKY.post_ids())  # retried, as plain Scrapy does
    fields = site_fields(state_client, prefix, "127.0.0.3")
    assert not {"backoffs", "until", "slowdowns", "slow"} & set(fields), fields
    assert int(fields["server_errors"]) == len(refused)  # each one seen, and counted


def test_a_site_that_answers_503_above_a_rate_is_held_below_it(
    app: Celery,
    prefix: str,
    state_client: redis.Redis,
    server_error_workers: Callable[..., Worker],
) -> None:
    result, arrivals = crawl_site(app, OVERLOADED, "127.0.0.4")
    learnt = after(arrivals, 5.0)
    share, share_then, most_then = (
        share_503(arrivals),
        share_503(learnt),
        most_in_one_second(learnt),
    )
    fields = site_fields(state_client, prefix, "127.0.0.4")
    print(
        f"overloaded site: {len(arrivals)} requests in {span(arrivals):.1f} s, {share:.1%} 503s,"
        f" {share_then:.1%} after the first 5 s, then at most {most_then} in one second;"
        f" {fields.get('slowdowns')} slowdowns"
    )
    assert result["state"] == "done"
    assert int(fields["slowdowns"]) >= 1 and "backoffs" not in fields
    # Learning the rate costs the first responses, at full speed (about 100 503s in the
    # first second, measured): without the slowdowns, most requests would be refused
    assert share < 0.25
    assert share_then < 0.05  # then few 503s,
    assert most_then <= 1.5 * CAPACITY  # at about the site's rate


def after(arrivals: list[Arrival], seconds: float) -> list[Arrival]:
    return [a for a in arrivals if a.started >= arrivals[0].started + seconds]


def share_503(arrivals: list[Arrival]) -> float:
    return Counter(a.status for a in arrivals)[503] / len(arrivals)
