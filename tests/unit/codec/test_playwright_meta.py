"""scrapy-playwright's request meta on the queue: page methods travel by name, the live
page of ``playwright_include_page`` stays in the process that opened it."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import msgpack
import pytest
from scrapy import Request, Spider
from scrapy_playwright.page import PageMethod

from celery_crawl.codec.serializer import JsonCodec, MsgpackCodec, SignedPickleCodec
from celery_crawl.core.errors import DecodeError, EncodeError

CODECS = [MsgpackCodec(), JsonCodec()]


def rendered(**meta: Any) -> Request:
    methods = [
        PageMethod("wait_for_selector", "h1.title", timeout=5000),
        PageMethod("evaluate", "window.scrollBy(0, 100)"),
        PageMethod("screenshot", full_page=True, type="png"),
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
        ("screenshot", (), {"full_page": True, "type": "png"}, None),
    ]


REFUSED = [
    (PageMethod(print), "give the page's method by name"),
    (PageMethod("set_input_files", "input", "/etc/passwd"), "not among the page methods"),
    (PageMethod("expose_function", "f", print), "not among the page methods"),
    (PageMethod("screenshot", path="/tmp/x.png"), "a path on the worker's disk"),
]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize(("method", "why"), REFUSED, ids=lambda v: str(v)[:30])
def test_page_methods_that_could_reach_beyond_the_page_are_refused(
    codec: Any, method: PageMethod, why: str, spider: Spider
) -> None:
    request = Request("http://x/", meta={"playwright_page_methods": [method]})
    with pytest.raises(EncodeError, match=re.escape(why)):
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


@pytest.mark.parametrize(
    "state",
    [["set_input_files", ["input", "/etc/passwd"], {}], ["screenshot", [], {"path": "/tmp/x"}]],
)
def test_a_payload_naming_a_refused_page_method_is_not_rebuilt(
    state: list[Any], spider: Spider
) -> None:
    with pytest.raises(DecodeError, match="a PageMethod: ") as raised:
        MsgpackCodec().decode(record_with(state), spider)
    assert raised.value.kind == "forbidden_class"


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        ({"playwright_page_init_callback": "os.system"}, "imported by name"),
        (
            {
                "playwright_context_kwargs": {
                    "user_data_dir": "/tmp/p",
                    "executable_path": "/bin/sh",
                }
            },
            "['executable_path', 'user_data_dir']",
        ),
        ({"playwright_context_kwargs": {"record_har_path": "/tmp/x.har"}}, "['record_har_path']"),
        (
            {"playwright_context_kwargs": {"storage_state": "/etc/shadow"}},
            "storage_state as a path",
        ),
        ({"playwright_context_kwargs": ["locale"]}, "not a dict of options"),
    ],
)
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_browser_meta_that_reaches_beyond_the_page_is_refused_when_read_back(
    codec: Any, meta: dict[str, Any], why: str, spider: Spider
) -> None:
    data = codec.encode(Request("http://x/", meta={"playwright": True, **meta}), spider)
    with pytest.raises(DecodeError, match=re.escape(why)) as raised:
        codec.decode(data, spider)
    assert raised.value.kind == "refused_meta"


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_context_options_about_the_page_are_read_back(codec: Any, spider: Spider) -> None:
    options = {
        "locale": "fr-FR",
        "viewport": {"width": 800, "height": 600},
        "storage_state": {"cookies": []},
    }
    request = Request("http://x/", meta={"playwright": True, "playwright_context_kwargs": options})
    assert (
        codec.decode(codec.encode(request, spider), spider).meta["playwright_context_kwargs"]
        == options
    )


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_page_event_handlers_named_as_spider_methods_are_read_back(
    codec: Any, spider: Spider
) -> None:
    handlers = {"dialog": "on_error", "response": "parse_post"}
    request = Request("http://x/", meta={"playwright": True, EVENTS: handlers})
    assert codec.decode(codec.encode(request, spider), spider).meta[EVENTS] == handlers


EVENTS = "playwright_page_event_handlers"
FOUND_BY_NAME = [  # scrapy-playwright would take getattr(spider, name) of each
    ({"dialog": "name"}, "is not a method of spider"),  # the spider's name, a string
    ({"dialog": "__class__"}, "is not a callback name"),
    ({"dialog": "crawler"}, "is not a method of spider"),
    ({"dialog": "os.system"}, "is not a callback name"),
    ({"dialog": "_set_crawler"}, "is Scrapy's, not a callback"),
    ({"dialog": 7}, "as a method of the spider, or its name"),
    (["dialog"], "as a method of the spider, or its name"),
]


@pytest.mark.parametrize(("handlers", "why"), FOUND_BY_NAME, ids=lambda v: str(v)[:30])
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_page_event_handlers_that_are_not_spider_methods_are_refused_both_ways(
    codec: Any, handlers: Any, why: str, spider: Spider
) -> None:
    """Refused when yielded (EncodeError), and when a queue writer puts them in a payload
    (DecodeError ``refused_meta``): a handler from the queue is a method of the spider."""
    request = Request("http://x/", meta={"playwright": True, EVENTS: handlers})
    with pytest.raises(EncodeError, match=re.escape(why)):
        codec.encode(request, spider)
    harmless = codec.encode(Request("http://x/", meta={"playwright": True, EVENTS: {}}), spider)
    forged = forge(codec, harmless, handlers)
    with pytest.raises(DecodeError, match=re.escape(why)) as raised:
        codec.decode(forged, spider)
    assert raised.value.kind == "refused_meta"


def forge(codec: Any, payload: bytes, handlers: Any) -> bytes:
    """``payload`` with its meta's event handlers replaced, as a queue writer could."""
    if codec.name == "json":
        record = json.loads(payload)
        record[record.index({"playwright": True, EVENTS: {}})] = {
            "playwright": True,
            EVENTS: handlers,
        }
        return json.dumps(record).encode()
    record = msgpack.unpackb(payload, raw=False)
    record[record.index({"playwright": True, EVENTS: {}})] = {"playwright": True, EVENTS: handlers}
    return bytes(msgpack.packb(record, use_bin_type=True))


def on_dialog(dialog: Any) -> None:
    """A page event handler that is no method of the spider."""


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_a_page_event_handler_that_is_a_spider_method_is_queued_as_its_name(
    codec: Any, spider: Spider
) -> None:
    """scrapy-playwright's usual ``{"dialog": self.on_dialog}``: queued as the method's name,
    which scrapy-playwright finds on the spider again; a function has no name to queue."""
    request = Request("http://x/", meta={"playwright": True, EVENTS: {"dialog": spider.on_error}})
    decoded = codec.decode(codec.encode(request, spider), spider)
    assert decoded.meta[EVENTS] == {"dialog": "on_error"}
    assert request.meta[EVENTS] == {"dialog": spider.on_error}  # the request itself unchanged
    with pytest.raises(EncodeError, match=re.escape("as a method of the spider, or its name")):
        codec.encode(Request("http://x/", meta={EVENTS: {"dialog": on_dialog}}), spider)


def test_signed_pickle_carries_any_page_event_handler(spider: Spider) -> None:
    """Its entries are signed, so trusted: a function goes as itself, a method of the spider
    as its name (pickling the method would pickle the spider)."""
    codec = SignedPickleCodec("a-test-secret-that-is-long-enough")
    handlers = {"dialog": on_dialog, "response": spider.on_error}
    request = Request("http://x/", meta={"playwright": True, EVENTS: handlers})
    decoded = codec.decode(codec.encode(request, spider), spider)
    assert decoded.meta[EVENTS] == {"dialog": on_dialog, "response": "on_error"}
