"""meta and cb_kwargs keep their types through the safe codecs, and forged classes stay out."""

from __future__ import annotations

import contextlib
import json
import sys
from collections import OrderedDict, namedtuple
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request
from scrapy.settings import Settings

from celery_crawl.codec.serializer import JsonCodec, MsgpackCodec, allowed_modules, to_record
from celery_crawl.codec.tags import MAX_DEPTH, Classes, zone_keys
from celery_crawl.core.errors import ConfigError, DecodeError, EncodeError
from tests.support import rich_values
from tests.support.rich_values import (
    CALLS,
    Offer,
    Product,
    Tripwire,
    TripwireItem,
    local_dataclass,
    rich_meta,
    same,
    values,
)
from tests.support.stub_spider import ForumSpider

ALLOWED = Classes(["tests.support"])
CODECS = [MsgpackCodec(ALLOWED), JsonCodec(ALLOWED)]
SPIDER = ForumSpider()  # hypothesis tests take no function-scoped fixtures
URL = "http://127.0.0.1/x"
SUPPORT = "tests.support.rich_values"


def round_trip(codec: Any, meta: dict[str, Any], cb_kwargs: dict[str, Any] | None = None) -> Any:
    request = Request(URL, meta=meta, cb_kwargs=cb_kwargs or {})
    return codec.decode(codec.encode(request, SPIDER), SPIDER)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@settings(max_examples=150, deadline=None)
@given(value=values)
def test_any_nesting_of_supported_kinds_comes_back_with_its_types(codec: Any, value: Any) -> None:
    decoded = round_trip(codec, {"v": value}, {"v": value})
    assert same(decoded.meta["v"], value)
    assert same(decoded.cb_kwargs["v"], value)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_a_half_built_item_and_friends_come_back_equal(codec: Any) -> None:
    meta = rich_meta()
    decoded = round_trip(codec, meta, {"item": meta["item"]})
    assert same(decoded.meta, meta)
    assert type(decoded.cb_kwargs["item"]) is Product


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_rebuilding_runs_none_of_the_classes_code(codec: Any) -> None:
    meta = {"t": Tripwire(5), "i": TripwireItem(value=6)}
    data = codec.encode(Request(URL, meta=meta), SPIDER)
    CALLS.clear()
    decoded = codec.decode(data, SPIDER)
    assert CALLS == []
    assert decoded.meta["t"].value == 5 and decoded.meta["i"]["value"] == 6


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_subclasses_of_plain_kinds_travel_as_the_plain_kind(codec: Any) -> None:
    pair = namedtuple("pair", "a b")
    meta = {"o": OrderedDict(a=1), "p": pair(1, 2), "s": type("S", (str,), {})("x")}
    decoded = round_trip(codec, meta).meta
    assert same(decoded, {"o": {"a": 1}, "p": (1, 2), "s": "x"})


def test_plain_meta_is_written_as_version_1_byte_for_byte(spider: Any) -> None:
    request = Request(URL, callback=spider.parse_post, meta={"a": [1, {"b": None}], "c": 2.5})
    old = msgpack.packb(to_record(request, spider), use_bin_type=True)
    assert MsgpackCodec().encode(request, spider) == old
    assert json.loads(JsonCodec().encode(request, spider))[0] == 1


def test_tagged_meta_is_version_2() -> None:
    request = Request(URL, meta={"t": (1,)})
    assert msgpack.unpackb(CODECS[0].encode(request, SPIDER), ext_hook=lambda *_: 0)[0] == 2
    assert json.loads(CODECS[1].encode(request, SPIDER))[0] == 2


def test_version_1_records_still_decode_as_before() -> None:
    assert MsgpackCodec().decode(msgpack.packb([1, URL]), SPIDER).url == URL
    record = [1, URL, None, None, "GET", {}, "", {}, {"$tuple": [1], "n": float("nan")}]
    meta = JsonCodec().decode(json.dumps(record).encode(), SPIDER).meta
    assert meta["$tuple"] == [1]  # version 1 meta is plain: a "$" key is just a key


def test_tagged_values_in_a_version_1_record_are_refused() -> None:
    record = [1, URL, None, None, "GET", {}, b"", {}, {"t": msgpack.ExtType(1, b"\x90")}]
    with pytest.raises(DecodeError) as info:
        MsgpackCodec().decode(msgpack.packb(record), SPIDER)
    assert info.value.kind == "malformed"


def test_msgpack_timestamps_are_datetimes_in_utc() -> None:
    record = [1, URL, None, None, "GET", {}, b"", {}, {"t": msgpack.Timestamp(1_700_000_000)}]
    meta = MsgpackCodec().decode(msgpack.packb(record), SPIDER).meta
    assert meta["t"] == datetime.fromtimestamp(1_700_000_000, UTC)


# -- what cannot be encoded says where it is and what to do -------------------


class Tz(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        return timedelta(0)


@pytest.mark.parametrize(
    "codec",
    [MsgpackCodec(Classes(["myproj"])), JsonCodec(Classes(["myproj"]))],
    ids=lambda c: c.name,
)
@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (
            {"item": Product(name="x")},
            f"meta['item'] holds a {SUPPORT}.Product, whose module is not allowed: add 'tests'"
            " to SCHEDULER_ALLOWED_MODULES",
        ),
        (
            {"a": {"b": [1, object()]}},
            "meta['a']['b'][1] holds a builtins.object, which is not a kind the queue carries",
        ),
        ({"when": datetime(2026, 1, 1, tzinfo=Tz())}, "meta['when'] holds a time with a tzinfo"),
        ({"k": {object(): 1}}, "a key of meta['k'] holds a builtins.object"),
    ],
)
def test_unsupported_values_are_encode_errors_with_their_path(
    codec: Any, meta: dict[str, Any], message: str
) -> None:
    with pytest.raises(EncodeError) as info:
        codec.encode(Request(URL, meta=meta), SPIDER)
    assert message in str(info.value)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_classes_that_cannot_be_named_and_cycles_are_encode_errors(codec: Any) -> None:
    with pytest.raises(EncodeError, match=r"cb_kwargs\['x'\] holds .*define it at the top level"):
        codec.encode(Request(URL, cb_kwargs={"x": local_dataclass()}), SPIDER)
    offer = Offer(None)
    offer.seen.append(offer)
    with pytest.raises(EncodeError, match="cycle"):
        codec.encode(Request(URL, meta={"o": offer}), SPIDER)


def test_allowed_modules_are_the_setting_and_the_spider_packages() -> None:
    settings = Settings({"SPIDER_MODULES": ["myproj.spiders", "flat"]})
    settings.set("SCHEDULER_ALLOWED_MODULES", "shared.models,other")
    assert allowed_modules(settings) == ["myproj", "flat", "shared.models", "other"]
    classes = Classes(allowed_modules(settings))
    assert classes.allows("myproj.items") and classes.allows("shared.models")
    assert not classes.allows("myproject") and not classes.allows("shared")
    with pytest.raises(ConfigError, match="SCHEDULER_ALLOWED_MODULES"):
        Classes(["my-proj"])


# -- forged payloads: a clear DecodeError, no import, no code ------------------

FORGED_CLASSES = [
    ("os", "system"),
    ("builtins", "eval"),
    ("subprocess", "Popen"),
    ("posix", "system"),
    ("importlib", "import_module"),
    ("tests.support.never_imported", "Bait"),  # allowed, never imported: not imported now
    ("tests.support.no_such_module", "Thing"),
    (SUPPORT, "NotAKind"),  # allowed module, not one of the kinds
    (SUPPORT, "OrderedDict"),  # an alias of a class from elsewhere
    (SUPPORT, "local_dataclass"),  # a function
    (SUPPORT, "dataclasses.dataclass"),  # through an imported module
    (SUPPORT, "Outer.__class__"),
    (SUPPORT, "Color"),  # an enum, under the dataclass tag below
    (SUPPORT, "CALLS"),
    ("tests.support", "rich_values.Product"),  # a module is not a class namespace here
    ("", "x"),
    ("os", "../etc"),
]
CLASS_TAGS = {11: "enum", 12: "item", 13: "dataclass", 14: "attrs"}


def _forged_msgpack(code: int, state: Any, raw: bytes | None = None) -> bytes:
    """A record whose meta["x"] is ext type ``code`` (-128 to 127) holding ``state``, packed."""
    data = msgpack.packb(state) if raw is None else raw
    ext = b"\xc9" + len(data).to_bytes(4, "big") + code.to_bytes(1, "big", signed=True) + data
    fields = [2, URL, None, None, "GET", {}, b"", {}]
    return b"\x99" + b"".join(msgpack.packb(f) for f in fields) + b"\x81\xa1x" + ext


def _forged_json(name: str, state: Any) -> bytes:
    return json.dumps([2, URL, None, None, "GET", {}, "", {}, {"x": {f"${name}": state}}]).encode()


def _decode_all(payloads: list[tuple[Any, bytes]]) -> set[str]:
    """Each payload is a DecodeError; none imports a module or runs project code."""
    zone_keys()  # the time zone list, read once per process (it may import importlib.resources)
    CALLS.clear()
    before = set(sys.modules)
    kinds = set()
    for codec, data in payloads:
        with pytest.raises(DecodeError) as info:
            codec.decode(data, SPIDER)
        kinds.add(info.value.kind)
    assert set(sys.modules) == before
    assert CALLS == []
    return kinds


@pytest.mark.parametrize(("module", "qualname"), FORGED_CLASSES)
def test_forged_classes_are_refused_without_import_or_code(module: str, qualname: str) -> None:
    payloads = []
    for code, name in CLASS_TAGS.items():
        for fields in ({}, {"value": 1}, [1], None):
            state = [module, qualname, fields]
            payloads += [(CODECS[0], _forged_msgpack(code, state))]
            payloads += [(CODECS[1], _forged_json(name, state))]
    kinds = _decode_all(payloads)
    assert kinds <= {"forbidden_class", "unknown_class", "malformed"}
    assert "tests.support.never_imported" not in sys.modules


def test_allowed_classes_with_forged_fields_are_malformed() -> None:
    payloads = [
        (CODECS[0], _forged_msgpack(12, [SUPPORT, "Product", {"nope": 1}])),
        (CODECS[0], _forged_msgpack(13, [SUPPORT, "Offer", {"nope": 1}])),
        (CODECS[0], _forged_msgpack(11, [SUPPORT, "Color", "BLUE"])),
        (CODECS[0], _forged_msgpack(11, [SUPPORT, "Color", [1]])),  # a value only for flags
        (CODECS[0], _forged_msgpack(13, [SUPPORT, "Tripwire", {"value": [1]}, "extra"])),
        (CODECS[1], _forged_json("attrs", [SUPPORT, "Page", {"url": "u", "x": 1}])),
        (CODECS[1], _forged_json("datetime", [2026, 13, 1, 0, 0, 0, 0, 0, None])),
        (CODECS[1], _forged_json("datetime", [2026, 1, 1, 0, 0, 0, 0, 0, "../../etc/passwd"])),
        (CODECS[0], _forged_msgpack(2, [[1]])),  # an unhashable set member
        (CODECS[1], _forged_json("float", "1e5")),
    ]
    assert _decode_all(payloads) == {"malformed"}


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    data = msgpack.packb([])
    tree: Any = []
    for _ in range(MAX_DEPTH + 5):
        data = msgpack.packb([msgpack.ExtType(1, data)])
        tree = {"$tuple": [tree]}
    record = [2, URL, None, None, "GET", {}, "", {}, {"x": tree}]
    payloads = [
        (CODECS[0], _forged_msgpack(1, None, raw=data)),
        (CODECS[1], json.dumps(record).encode()),
    ]
    assert _decode_all(payloads) == {"too_deep"}


_names = st.sampled_from([m for m, _ in FORGED_CLASSES] + [SUPPORT, "tests", "sys"])
_ints = st.integers(-(2**63), 2**63 - 1)
_fields = st.dictionaries(st.sampled_from(["value", "name", "x"]), _ints, max_size=2)
_states = st.one_of(
    st.binary(max_size=20),
    st.lists(st.one_of(_names, st.text(max_size=12), _ints, st.none()), max_size=4),
    st.tuples(_names, st.sampled_from(["system", "Bait", "NotAKind", "Product"]), _fields).map(
        list
    ),
)


@settings(max_examples=300, deadline=None)
@given(code=st.integers(-128, 127), state=_states, raw=st.booleans())
def test_fuzzed_ext_types_never_import_nor_run_code(code: int, state: Any, raw: bool) -> None:
    zone_keys()
    CALLS.clear()
    before = set(sys.modules)
    data = state if raw and isinstance(state, bytes) else msgpack.packb(state)
    json_state = state.hex() if isinstance(state, bytes) else state
    with contextlib.suppress(DecodeError):  # a few are valid: a tuple, an int...
        CODECS[0].decode(_forged_msgpack(code, None, raw=data), SPIDER)
    with contextlib.suppress(DecodeError):
        name = CLASS_TAGS.get(code, rich_values.__name__)
        CODECS[1].decode(_forged_json(name, json_state), SPIDER)
    assert set(sys.modules) == before
    assert CALLS == []
