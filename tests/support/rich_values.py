"""Values of every kind a request's meta may hold: project classes, a strategy, and equality.

The classes stand for a project's own (an Item, dataclasses, an attrs class,
enums); the codec tests allow this package. ``CALLS`` records every piece of
project code that runs in the tripwire classes, which a decoder must never call.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections import OrderedDict  # an alias here, not a class of this module
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import attrs
import scrapy
from hypothesis import strategies as st

__all__ = ["OrderedDict"]

CALLS: list[str] = []


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()
    tags = scrapy.Field()


class Color(enum.Enum):
    RED = "red"
    GREEN = (0, 255, 0)


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    R = 1
    W = 2
    X = 4


@dataclasses.dataclass
class Offer:
    product: Any
    price: Any = None
    seen: list[Any] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    x: Any
    y: Any


@attrs.define
class Page:
    url: str
    extra: Any = None


class Outer:
    @dataclasses.dataclass
    class Inner:
        value: Any


@dataclasses.dataclass
class Tripwire:
    """A dataclass whose every hook records that it ran."""

    value: Any = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Tripwire:
        CALLS.append("Tripwire.__new__")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        CALLS.append("Tripwire.__post_init__")

    def __setattr__(self, name: str, value: Any) -> None:
        CALLS.append("Tripwire.__setattr__")
        object.__setattr__(self, name, value)


class TripwireItem(scrapy.Item):
    value = scrapy.Field()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        CALLS.append("TripwireItem.__init__")
        super().__init__(*args, **kwargs)

    def __setitem__(self, key: str, value: Any) -> None:
        CALLS.append("TripwireItem.__setitem__")
        super().__setitem__(key, value)


class NotAKind:
    """A plain class of an allowed module: never rebuilt from a payload."""

    def __init__(self) -> None:
        CALLS.append("NotAKind.__init__")


def local_dataclass() -> Any:
    @dataclasses.dataclass
    class Local:
        value: int = 1

    return Local()


# -- equality that sees types: 1 == 1.0 == True, but not here ----------------


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    for kinds, equal in _EQUALITIES:
        if isinstance(a, kinds):
            return equal(a, b)
    if dataclasses.is_dataclass(a) or attrs.has(type(a)):
        return same(_fields(a), _fields(b))
    return bool(a == b)


def _same_float(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


def _same_mapping(a: Any, b: Any) -> bool:
    return list(a) == list(b) and all(same(a[k], b[k]) for k in a)


def _same_sequence(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(map(same, a, b))


def _same_clock(a: datetime | time, b: datetime | time) -> bool:
    naive = a.replace(tzinfo=None) == b.replace(tzinfo=None)
    return naive and a.fold == b.fold and a.tzinfo == b.tzinfo and a.tzname() == b.tzname()


_EQUALITIES: tuple[tuple[Any, Any], ...] = (
    (float, _same_float),
    (Decimal | enum.Enum, lambda a, b: str(a) == str(b)),
    (datetime | time, _same_clock),
    (dict | scrapy.Item, _same_mapping),
    (list | tuple, _same_sequence),
)


def _fields(value: Any) -> dict[str, Any]:
    if attrs.has(type(value)):
        return attrs.asdict(value, recurse=False)
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


# -- nested values of every kind ---------------------------------------------

_offsets = st.timedeltas(timedelta(hours=-23, minutes=-59), timedelta(hours=23, minutes=59))
time_zones = st.one_of(
    st.none(),
    st.timezones(),
    st.builds(timezone, _offsets),
    st.builds(timezone, _offsets, st.text(min_size=1, max_size=6)),
)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**300), 2**300),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.datetimes(timezones=time_zones),
    st.dates(),
    st.times(timezones=time_zones),
    st.timedeltas(),
    st.decimals(),
    st.uuids(),
    st.sampled_from([*Color, *Level, Perm.R, Perm.R | Perm.W, Perm(0)]),
)
hashables = st.one_of(
    st.integers(), st.text(max_size=5), st.binary(max_size=5), st.dates(), st.uuids()
)
keys = st.one_of(st.text(max_size=5), st.sampled_from(["$tuple", "$x", "$"]))


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(keys, children, max_size=4),
        st.dictionaries(hashables, children, max_size=3),
        st.sets(hashables, max_size=4),
        st.frozensets(hashables, max_size=4),
        st.builds(Product, name=children, price=children),
        st.builds(Offer, children, children),
        st.builds(Point, children, children),
        st.builds(Page, st.text(max_size=8), children),
        st.builds(Outer.Inner, children),
    )


values = st.recursive(leaves, _containers, max_leaves=12)


def rich_meta() -> dict[str, Any]:
    """One of each, as a spider would pass a half-built item to its next callback."""
    return {
        "item": Product(name="lamp", price=Decimal("19.90"), tags=("new", "sale")),
        "offer": Offer(Product(name="bulb"), 2**70, [date(2026, 1, 2)]),
        "point": Point(1.5, float("inf")),
        "page": Page("http://127.0.0.1/x", extra={1: "one", (2, 3): frozenset({4})}),
        "seen": {datetime(2026, 3, 29, 2, 30, tzinfo=timezone(timedelta(hours=2)))},
        "at": time(12, 0, tzinfo=UTC),
        "wait": timedelta(days=1, microseconds=5),
        "color": Color.GREEN,
        "level": Level.HIGH,
        "perm": Perm.R | Perm.X,
        "raw": b"\x00\xff",
        "nested": {"$tuple": [("a", ("b",))]},
    }
