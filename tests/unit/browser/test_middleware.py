"""RenderWhenNeeded on real Scrapy responses: which plain responses go to the browser,
and what the crawl's stats and the job's stats count."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse, Response
from scrapy.utils.test import get_crawler

from celery_crawl.browser.middleware import RenderWhenNeeded
from celery_crawl.core.errors import ConfigError
from celery_crawl.jobs.signals import JOB_META, job_stat


class PostSpider(Spider):
    name = "posts"

    def parse_post(self, response: Response) -> Any:
        return None


class DecidingSpider(PostSpider):
    def needs_browser(self, response: Response) -> bool:
        return b"app" in response.body


def middleware(spidercls: type[Spider], rules: Any) -> tuple[RenderWhenNeeded, list[str], Spider]:
    crawler = get_crawler(spidercls, {"BROWSER_RENDER_IF_MISSING": rules})
    crawler.spider = spider = spidercls()
    sent: list[str] = []
    crawler.signals.connect(  # type: ignore[attr-defined]
        lambda request, field: sent.append(f"{request.meta[JOB_META]}:{field}"),
        signal=job_stat,
        weak=False,
    )
    return RenderWhenNeeded.from_crawler(crawler), sent, spider


def response_to(spider: PostSpider, body: bytes, status: int = 200, **meta: Any) -> HtmlResponse:
    request = Request("http://x/post/1", callback=spider.parse_post, meta={JOB_META: "j1", **meta})
    return HtmlResponse(request.url, body=body, status=status, request=request)


def test_a_response_that_lacks_the_selector_is_sent_back_to_be_rendered() -> None:
    mw, sent, spider = middleware(PostSpider, {"parse_post": "h1.title"})
    bare = response_to(spider, b"<div id=app></div>")
    again = mw.process_response(bare.request, bare)
    assert isinstance(again, Request) and again.meta["playwright"] and again.dont_filter
    assert again.meta[JOB_META] == "j1" and again.callback == spider.parse_post
    whole = response_to(spider, b"<h1 class=title>Hi</h1>")
    assert mw.process_response(whole.request, whole) is whole
    assert sent == ["j1:browser/render_needed", "j1:browser/plain_enough"]
    assert mw.stats.get_stats() == {"browser/render_needed": 1, "browser/plain_enough": 1}


def test_rendered_failed_and_unruled_responses_are_kept_uncounted() -> None:
    mw, sent, spider = middleware(PostSpider, {"parse_post": "h1.title"})
    for response in (
        response_to(spider, b"<div></div>", playwright=True),  # rendered already
        response_to(spider, b"<div></div>", status=404),
    ):
        assert mw.process_response(response.request, response) is response
    other = HtmlResponse("http://x/", body=b"<div></div>", request=Request("http://x/"))
    assert mw.process_response(other.request, other) is other  # parse: no rule
    assert sent == [] and mw.stats.get_stats() == {}


def test_a_spiders_needs_browser_decides_for_every_plain_response() -> None:
    mw, sent, spider = middleware(DecidingSpider, {})
    assert isinstance(mw.process_response(*pair(response_to(spider, b"app"))), Request)
    kept = response_to(spider, b"<p>whole</p>")
    assert mw.process_response(kept.request, kept) is kept
    assert sent == ["j1:browser/render_needed", "j1:browser/plain_enough"]


def pair(response: HtmlResponse) -> tuple[Request, HtmlResponse]:
    return response.request, response  # type: ignore[return-value]


def test_without_a_rule_it_is_off_and_a_bad_rule_is_refused() -> None:
    with pytest.raises(NotConfigured):
        middleware(PostSpider, {})
    for bad in ({"parse_post": ""}, {"parse_post": 3}, {"": "h1"}, '{"parse_post": 3}'):
        with pytest.raises(ConfigError, match="BROWSER_RENDER_IF_MISSING"):
            middleware(PostSpider, bad)


def test_scrapy_takes_it_without_a_deprecation_warning() -> None:
    """Scrapy 2.19 warns about a downloader middleware whose methods take ``spider``."""
    from scrapy.core.downloader.middleware import DownloaderMiddlewareManager
    from scrapy.exceptions import ScrapyDeprecationWarning

    settings = {"DOWNLOADER_MIDDLEWARES": {"celery_crawl.browser.middleware.RenderWhenNeeded": 590}}
    crawler = get_crawler(DecidingSpider, settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScrapyDeprecationWarning)
        manager = DownloaderMiddlewareManager.from_crawler(crawler)
    assert any(isinstance(mw, RenderWhenNeeded) for mw in manager.middlewares)
