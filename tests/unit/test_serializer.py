"""Requests survive the trip through Redis encoding; garbage never crashes the decoder."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest

from celery_crawl.errors import ConfigError, DecodeError, EncodeError
from celery_crawl.serializer import JsonCodec, MsgpackCodec, codec_from_name
from tests.support.stub_spider import ForumSpider

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


def test_foreign_callback_cannot_be_encoded(spider: Spider) -> None:
    with pytest.raises(EncodeError, match="not a public method of spider"):
        MsgpackCodec().encode(Request("http://a/", callback=print), spider)


def test_unserializable_meta_is_an_encode_error(spider: Spider) -> None:
    with pytest.raises(EncodeError):
        MsgpackCodec().encode(Request("http://a/", meta={"obj": object()}), spider)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("_private", "unknown_callback"),
        ("close", "unknown_callback"),
        ("nope", "unknown_callback"),
        ("__class__", "unknown_callback"),
        ("from_crawler", "unknown_callback"),
    ],
)
def test_callbacks_resolve_only_to_the_spiders_public_methods(
    name: str, kind: str, spider: Spider
) -> None:
    import msgpack

    data = msgpack.packb([1, "http://a/", name])
    with pytest.raises(DecodeError) as info:
        MsgpackCodec().decode(data, spider)
    assert info.value.kind == kind


def test_parse_is_allowed(spider: Spider) -> None:
    import msgpack

    request = MsgpackCodec().decode(msgpack.packb([1, "http://a/", "parse"]), spider)
    assert request.callback == spider.parse


def test_unknown_request_class_is_refused(spider: Spider) -> None:
    import msgpack

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
    import msgpack

    for head in ([], [1], [1, "http://a/"]):
        with contextlib.suppress(DecodeError):
            MsgpackCodec().decode(msgpack.packb(head + record), SPIDER)
