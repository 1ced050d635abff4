"""Requests survive the trip through Redis encoding; garbage never crashes the decoder."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest
from scrapy.spiders import CrawlSpider, CSVFeedSpider, SitemapSpider, XMLFeedSpider

from celery_crawl.codec.serializer import JsonCodec, MsgpackCodec, codec_from_name
from celery_crawl.core.errors import ConfigError, DecodeError, EncodeError
from tests.support.stub_spider import CallbackKindsSpider, ForumSpider

CODECS = [MsgpackCodec(), JsonCodec()]
SPIDER = ForumSpider()  # hypothesis tests take no function-scoped fixtures


def full_request(spider: Spider) -> Request:
    return Request(
        "http://127.0.0.1:8000/post/100023?x=1",
        callback=spider.parse_post,  # type: ignore[attr-defined]
        errback=spider.on_error,  # type: ignore[attr-defined]
        method="POST",
        headers={"X-Token": "abc", "Accept": ["a/b", "c/d"]},
        body=b"\x00\xffpayload",
        cookies={"session": "s1"},
        meta={"forum_id": "00001", "depth": 2, "nested": {"a": [1, 2.5, None, True]}},
        cb_kwargs={"page": 3, "title": "héllo"},
        priority=-7,
        flags=["cached"],
        dont_filter=True,
        encoding="latin-1",
    )


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_round_trip_of_every_field(codec, spider: Spider) -> None:
    original = full_request(spider)
    decoded = codec.decode(codec.encode(original, spider), spider)
    assert decoded.url == original.url
    assert decoded.callback == spider.parse_post  # type: ignore[attr-defined]
    assert decoded.errback == spider.on_error  # type: ignore[attr-defined]
    assert decoded.method == "POST"
    assert decoded.headers.getlist("Accept") == [b"a/b", b"c/d"]
    assert decoded.headers.get("X-Token") == b"abc"
    assert decoded.body == b"\x00\xffpayload"
    assert decoded.cookies == {"session": "s1"}
    assert decoded.meta == original.meta
    assert decoded.cb_kwargs == original.cb_kwargs
    assert decoded.priority == -7
    assert decoded.flags == ["cached"]
    assert decoded.dont_filter is True
    assert decoded.encoding == "latin-1"


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_defaults_round_trip_compactly(codec, spider: Spider) -> None:
    request = Request("http://127.0.0.1/list/00001/1")
    data = codec.encode(request, spider)
    assert len(data) < 40
    decoded = codec.decode(data, spider)
    assert (decoded.url, decoded.callback, decoded.method, decoded.priority) == (
        request.url,
        None,
        "GET",
        0,
    )


@pytest.mark.parametrize("cls", [FormRequest, JsonRequest])
def test_allowed_request_subclasses(cls: type[Request], spider: Spider) -> None:
    codec = MsgpackCodec()
    decoded = codec.decode(codec.encode(cls("http://127.0.0.1/x", body=b"{}"), spider), spider)
    assert type(decoded) is cls


def round_trip(callback: Any, spider: Spider, errback: Any = None) -> Request:
    codec = MsgpackCodec()
    request = Request("http://a/", callback=callback, errback=errback)
    return codec.decode(codec.encode(request, spider), spider)


def test_private_and_name_mangled_methods_round_trip(spider: Spider) -> None:
    kinds = CallbackKindsSpider()
    decoded = round_trip(spider._private, spider, errback=spider._private)  # type: ignore[attr-defined]
    assert decoded.callback == decoded.errback == spider._private  # type: ignore[attr-defined]
    assert round_trip(kinds.hidden(), kinds).callback == kinds.hidden()
    assert round_trip(kinds.decorated, kinds).callback == kinds.decorated  # __name__ "wrapper"
    # stored under the attribute name Scrapy finds it by, not the function's own name
    for method, name in [
        (kinds.hidden(), "_CallbackKindsSpider__hidden"),
        (kinds.decorated, "decorated"),
    ]:
        record = msgpack.unpackb(
            MsgpackCodec().encode(Request("http://a/", callback=method), kinds)
        )
        assert record[2] == name


@pytest.mark.parametrize(
    ("spidercls", "callback", "errback"),
    [
        (CrawlSpider, "_callback", "_errback"),
        (SitemapSpider, "_parse_sitemap", None),
        (XMLFeedSpider, "_parse", None),
        (CSVFeedSpider, "parse_rows", None),
        (Spider, "parse", None),
    ],
)
def test_methods_inherited_from_scrapy_round_trip(
    spidercls: type[Spider], callback: str, errback: str | None
) -> None:
    spider = spidercls(name="kinds")
    own_errback = getattr(spider, errback) if errback else None
    decoded = round_trip(getattr(spider, callback), spider, errback=own_errback)
    assert decoded.callback == getattr(spider, callback)
    assert decoded.errback == own_errback


def test_a_name_learnt_on_one_spider_is_not_trusted_where_an_instance_shadows_it() -> None:
    first, second = ForumSpider(), ForumSpider()
    round_trip(first.on_error, first)  # the name "on_error" is now known for the class
    second.on_error = second.parse_post  # type: ignore[method-assign]
    own = ForumSpider.on_error.__get__(second)  # its class's on_error: no longer found by name
    with pytest.raises(EncodeError, match="cannot be found by name"):
        MsgpackCodec().encode(Request("http://a/", callback=own), second)
    decoded = round_trip(second.on_error, second)  # the name now leads to parse_post
    assert decoded.callback == second.parse_post


def test_a_method_of_another_instance_is_not_this_spiders(spider: Spider) -> None:
    other = ForumSpider()
    with pytest.raises(EncodeError, match="not a method of spider 'forum'"):
        MsgpackCodec().encode(Request("http://a/", callback=other.parse_post), spider)


@pytest.mark.parametrize(
    "callback",
    [print, lambda response: None, functools.partial(ForumSpider.parse, None)],
    ids=["builtin", "lambda", "partial"],
)
def test_a_callback_that_is_no_method_cannot_be_encoded(callback: Any, spider: Spider) -> None:
    with pytest.raises(EncodeError, match="not a method of spider"):
        MsgpackCodec().encode(Request("http://a/", callback=callback), spider)


@pytest.mark.parametrize("name", ["static", "klass"])
def test_static_and_class_methods_are_not_callbacks(name: str) -> None:
    kinds = CallbackKindsSpider()
    with pytest.raises(EncodeError):
        MsgpackCodec().encode(Request("http://a/", callback=getattr(kinds, name)), kinds)


def test_unserializable_meta_is_an_encode_error(spider: Spider) -> None:
    with pytest.raises(EncodeError):
        MsgpackCodec().encode(Request("http://a/", meta={"obj": object()}), spider)


@pytest.mark.parametrize(
    "name",
    [
        "nope",  # no such attribute
        "name",  # an attribute that is no method
        "close",  # a static method
        "from_crawler",  # a class method: bound to the class, not to the spider
        "static",
        "klass",
        "__init__",  # special names never
        "__class__",
        "os.system",  # never an import path
        "builtins.print",
        "tests.support.stub_spider.renamed",
        "parse ",
        "_set_crawler",  # Scrapy's own, called with a response it would break the crawler
        "start",
        "start_requests",
        "log",
    ],
)
def test_names_resolve_only_to_methods_of_the_spider_instance(name: str) -> None:
    kinds = CallbackKindsSpider()
    with pytest.raises(DecodeError) as info:
        MsgpackCodec().decode(msgpack.packb([1, "http://a/", name]), kinds)
    assert info.value.kind == "unknown_callback"


def test_a_property_is_refused_without_being_evaluated() -> None:
    kinds = CallbackKindsSpider()
    with pytest.raises(DecodeError) as info:
        MsgpackCodec().decode(msgpack.packb([1, "http://a/", "looks_like_a_method"]), kinds)
    assert info.value.kind == "unknown_callback"
    assert CallbackKindsSpider.reads == 0


def test_an_instance_attribute_holding_another_objects_method_is_refused(spider: Spider) -> None:
    spider.borrowed = ForumSpider().parse  # type: ignore[attr-defined]
    with pytest.raises(DecodeError) as info:
        MsgpackCodec().decode(msgpack.packb([1, "http://a/", None, "borrowed"]), spider)
    assert info.value.kind == "unknown_callback"


def test_parse_is_allowed(spider: Spider) -> None:
    request = MsgpackCodec().decode(msgpack.packb([1, "http://a/", "parse"]), spider)
    assert request.callback == spider.parse


def test_unknown_request_class_is_refused(spider: Spider) -> None:
    record = [1, "http://a/", None, None, "GET", {}, b"", {}, {}, {}, 0, [], False, "utf-8", "os"]
    with pytest.raises(DecodeError) as info:
        MsgpackCodec().decode(msgpack.packb(record), spider)
    assert info.value.kind == "unknown_class"


def test_pickle_serializer_name_means_the_signed_codec_and_unknown_names_fail() -> None:
    codec = codec_from_name("scrapy_redis.picklecompat", secret="s" * 32)
    assert codec.name == "signed_pickle"
    with pytest.raises(ConfigError, match="SCHEDULER_PICKLE_SECRET"):
        codec_from_name("scrapy_redis.picklecompat")
    with pytest.raises(ConfigError, match="unsigned pickle is never read back"):
        codec_from_name("pickle")


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=300))
def test_decoder_on_arbitrary_bytes_raises_only_decode_error(codec, data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        codec.decode(data, SPIDER)


@settings(max_examples=300, deadline=None)
@given(
    record=st.lists(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**63), 2**63 - 1),
            st.floats(),
            st.text(max_size=8),
            st.binary(max_size=8),
            st.dictionaries(st.text(max_size=4), st.integers(-5, 5), max_size=3),
            st.lists(st.integers(-5, 5), max_size=3),
        ),
        max_size=16,
    )
)
def test_decoder_on_arbitrary_records_raises_only_decode_error(record: list) -> None:
    for head in ([], [1], [1, "http://a/"]):
        with contextlib.suppress(DecodeError):
            MsgpackCodec().decode(msgpack.packb(head + record), SPIDER)
