"""scrapy-playwright's request meta on the queue: page methods travel by name, the live
page of ``playwright_include_page`` stays in the process that opened it."""

from __future__ import annotations

import sys
from typing import Any

import msgpack
import pytest
from scrapy import Request, Spider
from scrapy_playwright.page import PageMethod

from celery_crawl.codec.serializer import JsonCodec, MsgpackCodec
from celery_crawl.core.errors import DecodeError, EncodeError

CODECS = [MsgpackCodec(), JsonCodec()]


def rendered(**meta: Any) -> Request:
    methods = [
        PageMethod("wait_for_selector", "h1.title", timeout=5000),
        PageMethod("evaluate", "window.scrollBy(0, 100)"),
        PageMethod("screenshot", path="shot.png", full_page=True),
    ]
    return Request(
        "http://x/js/post/1", meta={"playwright": True, "playwright_page_methods": methods, **meta}
    )


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_page_methods_travel_by_name_with_their_arguments(codec: Any, spider: Spider) -> None:
    original = rendered()
    original.meta["playwright_page_methods"][0].result = "an element"  # set by a render
    decoded = codec.decode(codec.encode(original, spider), spider)
    methods = decoded.meta["playwright_page_methods"]
    assert [type(m) for m in methods] == [PageMethod] * 3
    assert [(m.method, m.args, m.kwargs, m.result) for m in methods] == [
        ("wait_for_selector", ("h1.title",), {"timeout": 5000}, None),  # no result carried
        ("evaluate", ("window.scrollBy(0, 100)",), {}, None),
        ("screenshot", (), {"path": "shot.png", "full_page": True}, None),
    ]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_a_page_method_given_as_a_callable_is_an_encode_error(codec: Any, spider: Spider) -> None:
    request = Request("http://x/", meta={"playwright_page_methods": [PageMethod(print)]})
    with pytest.raises(EncodeError, match="give the page's method by name"):
        codec.encode(request, spider)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_the_live_page_of_a_retried_render_is_left_out(codec: Any, spider: Spider) -> None:
    page = object()  # what scrapy-playwright sets: a Playwright Page, of this process only
    request = rendered(playwright_include_page=True, playwright_page=page, depth=2)
    decoded = codec.decode(codec.encode(request, spider), spider)
    assert "playwright_page" not in decoded.meta
    assert decoded.meta["playwright_include_page"] is True and decoded.meta["depth"] == 2
    assert request.meta["playwright_page"] is page  # the request itself is unchanged


def test_a_page_method_is_not_rebuilt_where_scrapy_playwright_is_not_imported(
    spider: Spider, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = MsgpackCodec().encode(rendered(), spider)
    monkeypatch.delitem(sys.modules, "scrapy_playwright.page")
    with pytest.raises(DecodeError, match="scrapy_playwright is not imported"):
        MsgpackCodec().decode(data, spider)


def record_with(state: Any) -> bytes:
    """A request record whose meta holds a page method with ``state``, made by hand."""
    method = msgpack.ExtType(15, msgpack.packb(state))
    return msgpack.packb([2, "http://x/", None, None, "GET", {}, b"", {}, {"m": method}])


def test_a_page_method_made_by_hand_decodes(spider: Spider) -> None:
    decoded = MsgpackCodec().decode(record_with(["evaluate", ["1 + 1"], {"arg": 2}]), spider)
    method = decoded.meta["m"]
    assert (type(method), method.method, method.args, method.kwargs) == (
        PageMethod,
        "evaluate",
        ("1 + 1",),
        {"arg": 2},
    )


@pytest.mark.parametrize(
    "state", [["evaluate", "not a list", {}], [3, [], {}], ["evaluate", [], {1: 2}], ["x"]]
)
def test_a_malformed_page_method_is_a_decode_error(state: list[Any], spider: Spider) -> None:
    with pytest.raises(DecodeError, match=r"malformed|expected"):
        MsgpackCodec().decode(record_with(state), spider)
