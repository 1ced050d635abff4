"""Pickle only with a valid signature: anything else is refused before it is unpickled."""

from __future__ import annotations

import pickle
from fractions import Fraction
from typing import Any

import pytest
from scrapy import Request
from scrapy.settings import Settings

from celery_crawl.codec.serializer import SignedPickleCodec, codec_from_settings, to_record
from celery_crawl.core.errors import ConfigError, DecodeError, EncodeError
from tests.support.rich_values import CALLS, NotAKind, rich_meta, same

SECRET = "a-test-secret-that-is-long-enough"
URL = "http://127.0.0.1/x"


class Payload:
    """Unpickling this runs code: the decoder must never get that far on a forged entry."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (CALLS.append, ("unpickled",))


def signed(body: bytes, secret: str = SECRET) -> bytes:
    codec = SignedPickleCodec(secret)
    return codec.MAGIC + codec._mac(body) + body


def test_any_picklable_meta_round_trips(spider: Any) -> None:
    codec = SignedPickleCodec(SECRET)
    meta = {**rich_meta(), "fraction": Fraction(1, 3), "complex": 1 + 2j}
    request = Request(URL, callback=spider.parse_post, meta=meta, cb_kwargs={"n": (1, 2)})
    decoded = codec.decode(codec.encode(request, spider), spider)
    assert same(decoded.meta, meta) and same(decoded.cb_kwargs, {"n": (1, 2)})
    assert decoded.callback == spider.parse_post


def test_what_pickle_cannot_take_is_an_encode_error(spider: Any) -> None:
    with pytest.raises(EncodeError, match="cannot pickle"):
        SignedPickleCodec(SECRET).encode(Request(URL, meta={"f": lambda: 1}), spider)


def forged_entries(spider: Any) -> dict[str, bytes]:
    body = pickle.dumps([1, URL, None, None, "GET", {}, b"", {}, {"p": Payload()}])
    good = SignedPickleCodec(SECRET).encode(Request(URL, meta={"n": NotAKind}), spider)
    flipped_mac = bytearray(good)
    flipped_mac[len(SignedPickleCodec.MAGIC)] ^= 1
    return {
        "unsigned pickle": body,
        "magic without a signature": SignedPickleCodec.MAGIC + body[:10],
        "forged signature": SignedPickleCodec.MAGIC + b"\x00" * 32 + body,
        "another secret": signed(body, "another-secret-just-as-long"),
        "a flipped bit in the signature": bytes(flipped_mac),
        "a signed entry with another body": good[:-1] + bytes([good[-1] ^ 1]),
    }


def test_forged_unsigned_or_foreign_entries_are_never_unpickled(spider: Any) -> None:
    codec = SignedPickleCodec(SECRET)
    CALLS.clear()
    kinds = {}
    for what, data in forged_entries(spider).items():
        with pytest.raises(DecodeError) as info:
            codec.decode(data, spider)
        kinds[what] = info.value.kind
    assert CALLS == []
    assert kinds == {
        "unsigned pickle": "unsigned",
        "magic without a signature": "unsigned",
        "forged signature": "bad_signature",
        "another secret": "bad_signature",
        "a flipped bit in the signature": "bad_signature",
        "a signed entry with another body": "bad_signature",
    }


def test_a_signed_entry_is_still_checked_as_a_request(spider: Any) -> None:
    codec = SignedPickleCodec(SECRET)
    record = to_record(Request(URL), spider) + ["x"] * 20  # too many fields
    with pytest.raises(DecodeError) as info:
        codec.decode(signed(pickle.dumps(record)), spider)
    assert info.value.kind == "malformed"
    with pytest.raises(DecodeError) as info:
        codec.decode(signed(b"not a pickle"), spider)
    assert info.value.kind == "undecodable"


@pytest.mark.parametrize("name", ["signed_pickle", "scrapy_redis.picklecompat"])
def test_no_secret_no_start_with_the_how_to(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCHEDULER_PICKLE_SECRET", raising=False)
    with pytest.raises(ConfigError) as info:
        codec_from_settings(Settings({"SCHEDULER_SERIALIZER": name}))
    assert "set SCHEDULER_PICKLE_SECRET" in str(info.value)
    assert "secrets.token_hex(32)" in str(info.value)
    with pytest.raises(ConfigError, match="shorter than 16 bytes"):
        codec_from_settings(
            Settings({"SCHEDULER_SERIALIZER": name, "SCHEDULER_PICKLE_SECRET": "x"})
        )


def test_the_secret_may_come_from_the_environment(
    spider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDULER_PICKLE_SECRET", SECRET)
    codec = codec_from_settings(Settings({"SCHEDULER_SERIALIZER": "scrapy_redis.picklecompat"}))
    data = codec.encode(Request(URL), spider)
    assert SignedPickleCodec(SECRET).decode(data, spider).url == URL
