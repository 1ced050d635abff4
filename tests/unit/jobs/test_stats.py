"""A job's stats from Scrapy's signals: what a crawler's signal manager delivers to JobStats."""

from __future__ import annotations

from scrapy import Request, Spider, signals
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler
from twisted.python.failure import Failure

from celery_crawl.jobs.handle import parse_status
from celery_crawl.jobs.signals import JOB_META, job_items, job_stat
from celery_crawl.jobs.stats import JobStats


def connected() -> tuple[JobStats, object]:
    stats = JobStats()
    crawler = get_crawler(Spider)
    stats.connect(crawler.signals)
    return stats, crawler.signals


def test_a_rendered_response_counts_as_a_page_and_a_render_of_its_job() -> None:
    stats, manager = connected()
    rendered = Request("http://x/js/post/1", meta={JOB_META: "j1", "playwright": True})
    plain = Request("http://x/html/post/2", meta={JOB_META: "j1"})
    for request in (rendered, plain):
        response = HtmlResponse(request.url, body=b"<html></html>", request=request)
        manager.send_catch_log(  # type: ignore[attr-defined]
            signals.response_received, response=response, request=request, spider=None
        )
    assert sorted(stats.drain()) == [
        ("j1", "browser/rendered", 1),
        ("j1", "pages", 2),
        ("j1", "status/200", 2),
    ]


def test_job_stat_adds_one_to_the_field_of_the_requests_job_only() -> None:
    stats, manager = connected()
    for job in ("j1", "j1", "j2", ""):  # "": a request of no job counts nowhere
        request = Request("http://x/", meta={JOB_META: job} if job else {})
        manager.send_catch_log(job_stat, request=request, field="browser/plain_enough")  # type: ignore[attr-defined]
    assert sorted(stats.drain()) == [
        ("j1", "browser/plain_enough", 2),
        ("j2", "browser/plain_enough", 1),
    ]


def test_a_jobs_browser_counts_are_read_back_under_browser() -> None:
    raw = {
        b"state": b"done",
        b"pages": b"7",
        b"browser/rendered": b"5",
        b"browser/render_needed": b"2",
    }
    status = parse_status("j", "forum_mixed", raw, 0.0)
    assert status.browser == {"rendered": 5, "render_needed": 2}
    assert status.as_dict()["browser"] == {"rendered": 5, "render_needed": 2}
    assert parse_status("j", "forum", {b"state": b"done"}, 0.0).as_dict()["browser"] == {}


def test_a_handed_out_requests_changes_wait_for_its_ack() -> None:
    """Its page, status and items are held until released for its ack; a request not held
    (a retry's count, another process's) is drained at once; held ones forgotten are gone."""
    stats, manager = connected()
    held, other = (Request(f"http://x/{n}", meta={JOB_META: "j1"}) for n in (1, 2))
    stats.hold(held)
    for request in (held, other):
        response = HtmlResponse(request.url, body=b"<html></html>", request=request)
        manager.send_catch_log(  # type: ignore[attr-defined]
            signals.response_received, response=response, request=request, spider=None
        )
    manager.send_catch_log(job_items, response=response_of(held), count=3)  # type: ignore[attr-defined]
    assert sorted(stats.drain()) == [("j1", "pages", 1), ("j1", "status/200", 1)]  # other's
    released = stats.release(held)
    assert released == {("j1", "pages"): 1, ("j1", "status/200"): 1, ("j1", "items"): 3}
    assert stats.release(held) == {}  # released once
    assert stats.drain() == []  # released: written with its ack only, never drained
    stats.hold(held)
    stats.add("j1", "pages", request=held)
    stats.forget_held()  # its lease went back: the page is fetched, and counted, again
    assert stats.release(held) == {} and stats.drain() == []


def response_of(request: Request) -> HtmlResponse:
    return HtmlResponse(request.url, body=b"<html></html>", request=request)


def test_a_held_pages_dropped_items_and_callback_errors_go_with_its_ack() -> None:
    stats, manager = connected()
    request = Request("http://x/3", meta={JOB_META: "j1"})
    response = response_of(request)
    stats.hold(request)
    manager.send_catch_log(job_items, response=response, count=2)  # type: ignore[attr-defined]
    manager.send_catch_log(  # type: ignore[attr-defined]
        signals.item_dropped, item={}, response=response, exception=None, spider=None
    )
    manager.send_catch_log(  # type: ignore[attr-defined]
        signals.spider_error, failure=Failure(ValueError("bad")), response=response, spider=None
    )
    assert stats.drain() == []  # all held
    assert stats.release(request) == {
        ("j1", "items"): 1,
        ("j1", "items_dropped"): 1,
        ("j1", "errors/ValueError"): 1,
        ("j1", "errors"): 1,
    }
