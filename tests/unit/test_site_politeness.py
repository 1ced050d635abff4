"""The demo forum logs what arrived when, limits its rate with 429s, and injects 429s."""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from celery_crawl.demo.site import (
    Arrival,
    DemoSite,
    Request,
    SiteConfig,
    _parser,
    config_from_args,
    run_in_thread,
)

SMALL = SiteConfig(forums=2, posts_per_forum=30)
LIST = "/list/00001/1"
MISSING = "/post/999"


def get(port: int, path: str) -> tuple[int, str | None, bytes]:
    """Status, Retry-After header and body of one GET on a fresh loopback connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.getheader("Retry-After"), response.read()
    finally:
        connection.close()


def most_in_one_second(times: list[float]) -> int:
    """The most of ``times`` within any half-open window [t, t + 1)."""
    ordered = sorted(times)
    return max((sum(1 for t in ordered if s <= t < s + 1.0) for s in ordered), default=0)


def test_arrivals_record_path_status_and_times() -> None:
    config = SiteConfig(forums=2, posts_per_forum=30, latency=0.02)
    paths = [LIST, MISSING] * 10
    with run_in_thread(config) as site:
        before = time.time()
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(lambda path: get(site.port, path)[0], paths))
        assert site.wait_idle()
        after = time.time()
        arrivals = site.arrivals()
        max_in_flight = site.max_in_flight
    assert results == [200, 404] * 10
    assert sorted((a.path, a.status) for a in arrivals) == sorted(zip(paths, results, strict=True))
    for arrival in arrivals:
        assert before <= arrival.started <= arrival.ended <= after
        assert arrival.ended - arrival.started >= config.latency * 0.9
    assert 1 <= max_in_flight <= len(paths)


def test_reset_log_clears_arrivals_and_max() -> None:
    with run_in_thread(SMALL) as site:
        assert get(site.port, LIST)[0] == 200
        assert site.wait_idle()
        assert site.max_in_flight == 1 and len(site.arrivals()) == 1
        site.reset_log()
        assert site.arrivals() == [] and site.max_in_flight == 0
        assert get(site.port, MISSING)[0] == 404
        assert site.wait_idle()
        assert [(a.path, a.status) for a in site.arrivals()] == [(MISSING, 404)]


def test_arrivals_is_a_copy() -> None:
    with run_in_thread(SMALL) as site:
        get(site.port, LIST)
        assert site.wait_idle()
        site.arrivals().clear()
        assert len(site.arrivals()) == 1


def test_rate_limit_answers_429_with_retry_after() -> None:
    config = SiteConfig(forums=2, posts_per_forum=30, rate_limit=5, retry_after=3)
    with run_in_thread(config) as site:
        results = [get(site.port, LIST) for _ in range(12)]
        assert site.wait_idle()
        arrivals = sorted(site.arrivals(), key=lambda a: a.started)
    limited = [(header, body) for status, header, body in results if status == 429]
    assert limited, "12 quick requests against 5 per second: some must be refused"
    assert all(header == "3" for header, _ in limited)
    assert all(json.loads(body) == {"error": "rate limited"} for _, body in limited)
    assert all(header is None for status, header, _ in results if status != 429)
    assert [a.status for a in arrivals] == [status for status, _, _ in results]
    accepted = [a.started for a in arrivals if a.status != 429]
    assert 1 <= most_in_one_second(accepted) <= 5


def test_rate_window_slides() -> None:
    site = DemoSite(SiteConfig(forums=1, posts_per_forum=5, rate_limit=2, retry_after=7))
    request = Request("GET", "/list/00001/1", keep_alive=True, body_length=0)

    def status(at: float) -> int:
        return site.answer(request, arrived=at)[0]

    assert [status(100.0), status(100.5), status(100.9)] == [200, 200, 429]
    assert site.answer(request, arrived=100.95)[2] == {"Retry-After": "7"}
    assert status(101.0) == 200  # the arrival at 100.0 has left the window
    assert status(101.2) == 429  # 100.5 and 101.0 are still in it
    assert status(101.6) == 200
    assert site.responses_by_status[429] == 3


def test_an_overloaded_site_answers_503_without_retry_after_above_its_rate() -> None:
    site = DemoSite(SiteConfig(forums=1, posts_per_forum=5, rate_limit=2, rate_limit_status=503))
    request = Request("GET", "/list/00001/1", keep_alive=True, body_length=0)
    answers = [site.answer(request, arrived=at) for at in (100.0, 100.5, 100.9)]
    assert [status for status, _, _ in answers] == [200, 200, 503]
    assert answers[2][1:] == (b'{"error": "service unavailable"}', {})
    site.answer_429(count=1, retry_after=3)  # injected 429s stay 429s
    assert site.answer(request, arrived=100.95)[::2] == (429, {"Retry-After": "3"})


def test_no_rate_limit_by_default() -> None:
    site = DemoSite(SiteConfig(forums=1, posts_per_forum=5))
    request = Request("GET", "/list/00001/1", keep_alive=True, body_length=0)
    assert {site.answer(request, arrived=100.0)[0] for _ in range(50)} == {200}


def test_answer_429_refuses_exactly_the_next_requests() -> None:
    with run_in_thread(SMALL) as site:
        assert get(site.port, LIST)[0] == 200
        site.answer_429(count=1, retry_after=2)
        status, header, body = get(site.port, MISSING)  # any path
        assert (status, header) == (429, "2")
        assert json.loads(body) == {"error": "rate limited"}
        assert get(site.port, LIST)[:2] == (200, None)
        site.answer_429(count=2)
        assert [get(site.port, LIST)[0] for _ in range(3)] == [429, 429, 200]
        assert site.wait_idle()
        arrivals = sorted(site.arrivals(), key=lambda a: a.started)
    assert [a.status for a in arrivals] == [200, 429, 200, 429, 429, 200]
    assert arrivals[1] == Arrival(MISSING, arrivals[1].started, arrivals[1].ended, 429)


def test_answer_429_refuses_negative_counts() -> None:
    with run_in_thread(SMALL) as site, pytest.raises(ValueError, match="negative"):
        site.answer_429(count=-1)


@pytest.mark.parametrize(
    "overrides", [{"rate_limit": -1.0}, {"retry_after": -1}, {"rate_limit_status": 500}]
)
def test_bad_politeness_configs_are_refused(overrides: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"negative|429 or 503"):
        SiteConfig(**overrides)  # type: ignore[arg-type]


def test_cli_options_reach_the_config() -> None:
    args = _parser().parse_args(
        ["--rate-limit", "2.5", "--retry-after", "4", "--rate-limit-status", "503"]
    )
    config = config_from_args(args)
    assert (config.rate_limit, config.retry_after, config.rate_limit_status) == (2.5, 4, 503)
    defaults = config_from_args(_parser().parse_args([]))
    assert (defaults.rate_limit, defaults.retry_after) == (0.0, 1)
