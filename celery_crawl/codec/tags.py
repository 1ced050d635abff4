"""Tagged values: what meta and cb_kwargs carry beyond plain data, without pickle.

msgpack carries None, bools, ints of 64 bits, floats (inf and nan too), str,
bytes, lists and dicts itself. Every other value a request may hold travels
as a *tagged value*: a kind, and a *state* made of plain data and further
values, encoded in turn::

    kind        state                                msgpack ext   JSON
    tuple       [items]                              1             {"$tuple": [...]}
    set         [items]                              2             {"$set": [...]}
    frozenset   [items]                              3             {"$frozenset": [...]}
    int         hex string (beyond 64 bits)          4             {"$int": "0x..."}
    datetime    [y, m, d, H, M, S, us, fold, tz]     5             {"$datetime": [...]}
    date        [y, m, d]                            6             {"$date": [...]}
    time        [H, M, S, us, fold, tz]              7             {"$time": [...]}
    timedelta   [days, seconds, us]                  8             {"$timedelta": [...]}
    Decimal     str(value)                           9             {"$decimal": "..."}
    UUID        hex string                           10            {"$uuid": "..."}
    enum        [module, qualname, name | [value]]   11            {"$enum": [...]}
    scrapy.Item [module, qualname, {field: value}]   12            {"$item": [...]}
    dataclass   [module, qualname, {field: value}]   13            {"$dataclass": [...]}
    attrs class [module, qualname, {field: value}]   14            {"$attrs": [...]}
    PageMethod  [method name, [args], {kwargs}]      15            {"$page_method": [...]}

A time zone ``tz`` is None, an offset in microseconds (``datetime.timezone``;
``[offset, name]`` when it has a name) or a ``zoneinfo`` key. JSON also tags
bytes (``$bytes``, base64), inf and nan (``$float``), and a dict that has a
key other than a string, or whose only key starts with ``$`` (``$dict``,
``[[key, value], ...]``). A subclass of a built-in kind travels as that kind
(a namedtuple as a tuple, an ``OrderedDict`` as a dict).

The kinds that name a class are rebuilt only when :class:`Classes` allows the
class's module and the module is already imported in this process: a payload
never makes a process import anything. The name must lead, through the
module's and the classes' own namespaces, to a class defined there (not an
alias), of the tag's kind. The instance is rebuilt as pickle does, without
calling the class: ``object.__new__`` and the fields set one by one (an Item
through Scrapy's own ``Item.__setitem__``, which refuses unknown fields).
Anything else read back raises :class:`DecodeError`; values that cannot be
written raise :class:`EncodeError` saying where they are and what to do.

scrapy-playwright's ``PageMethod`` (``meta["playwright_page_methods"]``) travels as
its method's name and arguments, for the methods of :data:`PAGE_METHODS` only and
without a ``path`` argument: a payload names a method that the renderer calls. A
method given as a callable cannot travel, and its ``result``, set once the page is
rendered, is not carried. It is rebuilt only in a process that has imported
``scrapy_playwright.page`` (any that renders has).
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from functools import cache
from types import ModuleType
from typing import Any
from uuid import UUID
from zoneinfo import TZPATH, ZoneInfo, available_timezones

import msgpack
from scrapy import Item

from celery_crawl.core.errors import ConfigError, DecodeError, EncodeError

SETTING = "SCHEDULER_ALLOWED_MODULES"
MAX_DEPTH = 32  # tagged values inside tagged values; each level costs C stack in msgpack
MSGPACK_INTS = (-(2**63), 2**64)  # [low, high): msgpack's own; beyond, an int is tagged
_US = timedelta(microseconds=1)
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Tag:
    """A kind of tagged value: its msgpack ext code, its JSON name and its two directions."""

    code: int
    name: str
    state: Callable[[Any], Any]
    build: Callable[[Any, Classes], Any]


@dataclasses.dataclass(frozen=True, eq=False)
class ClassKind:
    """A kind of value that names its class: enums, Items, dataclasses, attrs classes."""

    what: str
    accepts: Callable[[type], bool]
    fields: Callable[[Any], Any]
    rebuild: Callable[[type, Any], Any]


# -- the classes a payload may name ------------------------------------------


class Classes:
    """The modules whose classes may travel: these modules and packages, and what is below."""

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        names = {name.strip() for name in allowed if name.strip()}
        for name in names:
            if not _dotted(name):
                raise ConfigError(f"{SETTING}: {name!r} is not a module or package name")
        self.allowed = tuple(sorted(names))
        self._checked: set[type] = set()

    def allows(self, module: str) -> bool:
        return any(module == name or module.startswith(name + ".") for name in self.allowed)

    def check(self, cls: type) -> None:
        """Encoding: ``cls`` can be named in a payload, and found again by that name."""
        if cls in self._checked:
            return
        module, name = cls.__module__, f"{cls.__module__}.{cls.__qualname__}"
        if not self.allows(module):
            top = module.split(".")[0]
            raise EncodeError(f"a {name}, whose module is not allowed: add {top!r} to {SETTING}")
        try:
            found: type | None = _lookup(sys.modules[module], cls.__qualname__)
        except (KeyError, DecodeError):
            found = None
        if found is not cls:
            raise EncodeError(
                f"a {name}, which cannot be found again by that name (a class made inside a"
                " function?): define it at the top level of its module"
            )
        self._checked.add(cls)

    def find(self, module: Any, qualname: Any, kind: ClassKind) -> type:
        """Decoding: the class ``module.qualname``, if allowed, imported and of ``kind``."""
        if not (isinstance(module, str) and isinstance(qualname, str)):
            raise DecodeError("malformed", "a class is named by two strings")
        if not (_dotted(module) and _dotted(qualname)) or ".__" in f".{qualname}":
            raise DecodeError("malformed", f"{module!r}, {qualname!r} is not a class name")
        if not self.allows(module):
            raise DecodeError(
                "forbidden_class", f"{module}.{qualname}: module {module!r} is not in {SETTING}"
            )
        loaded = sys.modules.get(module)
        if loaded is None:
            raise DecodeError(
                "unknown_class",
                f"{module}.{qualname}: module {module!r} is allowed but not imported here;"
                " import it from the spider's module",
            )
        cls = _lookup(loaded, qualname)
        if not kind.accepts(cls):
            raise DecodeError("forbidden_class", f"{module}.{qualname} is not {kind.what}")
        return cls


def _dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def _lookup(module: ModuleType, qualname: str) -> type:
    """The class at ``qualname`` in ``module``: own namespaces only, no getattr hooks."""
    space: Any = module
    for part in qualname.split("."):
        space = vars(space).get(part)
        if not isinstance(space, type):
            raise DecodeError("forbidden_class", f"{module.__name__}.{qualname} is not a class")
    if (space.__module__, space.__qualname__) != (module.__name__, qualname):
        raise DecodeError(
            "forbidden_class", f"{module.__name__}.{qualname} is not defined there (an alias)"
        )
    return space  # type: ignore[no-any-return]


# -- the kinds of classes ----------------------------------------------------


def _enum_fields(member: enum.Enum) -> Any:
    if type(member).__members__.get(member.name) is member:
        return member.name
    return [member.value]  # a combination of Flag members


def _enum_rebuild(cls: type, key: Any) -> Any:
    members: Mapping[str, Any] = cls.__members__  # type: ignore[attr-defined]
    if isinstance(key, str) and key in members:
        return members[key]
    is_value = isinstance(key, list) and len(key) == 1 and type(key[0]) is int
    if is_value and issubclass(cls, enum.Flag):
        return cls(key[0])
    raise DecodeError("malformed", f"{cls.__qualname__} has no member {key!r}")


def _item_rebuild(cls: type, fields: Any) -> Item:
    item: Item = Item.__new__(cls)  # Scrapy's own: the subclass's code does not run
    Item.__init__(item)
    for key, value in _str_dict(fields).items():
        Item.__setitem__(item, key, value)  # KeyError for a field the class does not declare
    return item


def _attributes(value: Any, names: Iterable[str]) -> dict[str, Any]:
    found = {name: getattr(value, name, _MISSING) for name in names}
    return {name: v for name, v in found.items() if v is not _MISSING}


def _set_attributes(cls: type, fields: Any, names: Iterable[str]) -> Any:
    fields = _str_dict(fields)
    unknown = set(fields) - set(names)
    if unknown:
        raise DecodeError("malformed", f"{cls.__qualname__} has no field {sorted(unknown)[0]!r}")
    obj: Any = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)  # frozen and slotted classes too, as pickle does
    return obj


def _dataclass_names(cls: Any) -> list[str]:
    return [field.name for field in dataclasses.fields(cls)]


def _attrs() -> Any:
    """attrs, if this process uses it: without it loaded, no attrs class exists here."""
    return sys.modules.get("attr")


def _is_attrs(cls: type) -> bool:
    attr = _attrs()
    return attr is not None and bool(attr.has(cls))


def _attrs_names(cls: type) -> list[str]:
    return [field.name for field in _attrs().fields(cls)]


ENUM = ClassKind("an enum", lambda c: issubclass(c, enum.Enum), _enum_fields, _enum_rebuild)
ITEM = ClassKind("a scrapy.Item", lambda c: issubclass(c, Item), dict, _item_rebuild)
DATACLASS = ClassKind(
    "a dataclass",
    dataclasses.is_dataclass,
    lambda v: _attributes(v, _dataclass_names(v)),
    lambda c, f: _set_attributes(c, f, _dataclass_names(c)),
)
ATTRS = ClassKind(
    "an attrs class",
    _is_attrs,
    lambda v: _attributes(v, _attrs_names(type(v))),
    lambda c, f: _set_attributes(c, f, _attrs_names(c)),
)
CLASS_KINDS = (ENUM, ITEM, DATACLASS, ATTRS)


def class_kind(cls: type) -> ClassKind | None:
    for kind in CLASS_KINDS:
        if kind.accepts(cls):
            return kind
    return None


def _class_tag(code: int, name: str, kind: ClassKind) -> Tag:
    def state(value: Any) -> list[Any]:
        cls = type(value)
        return [cls.__module__, cls.__qualname__, kind.fields(value)]

    def build(state: Any, classes: Classes) -> Any:
        module, qualname, fields = _list(state, 3)
        return kind.rebuild(classes.find(module, qualname, kind), fields)

    return Tag(code, name, state, build)


# -- the built-in kinds ------------------------------------------------------


def _list(state: Any, length: int | None = None) -> list[Any]:
    if not isinstance(state, list) or (length is not None and len(state) != length):
        raise DecodeError("malformed", f"expected a list of {length or 'any'} values")
    return state


def _str(state: Any) -> str:
    if not isinstance(state, str):
        raise DecodeError("malformed", f"expected a string, got {type(state).__name__}")
    return state


def _str_dict(state: Any) -> dict[str, Any]:
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise DecodeError("malformed", "expected a dict of fields")
    return state


def _tz_state(tz: tzinfo | None) -> Any:
    if tz is None:
        return None
    if isinstance(tz, timezone):
        offset = tz.utcoffset(None)
        micros = offset // _US
        name = tz.tzname(None)
        return micros if timezone(offset).tzname(None) == name else [micros, name]
    if isinstance(tz, ZoneInfo) and _known_zone(tz.key):
        return tz.key
    raise EncodeError(
        f"a time with a tzinfo {tz!r} of type {type(tz).__qualname__}: use datetime.timezone"
        " or a zoneinfo.ZoneInfo of the time zone database"
    )


def _tz(state: Any) -> tzinfo | None:
    if state is None:
        return None
    if type(state) is int:
        return timezone(state * _US)
    if isinstance(state, list):
        micros, name = _list(state, 2)
        return timezone(micros * _US, _str(name))
    key = _str(state)
    if not _known_zone(key):
        raise DecodeError("malformed", f"{key[:64]!r} is not a time zone of the database")
    return ZoneInfo(key)


def _known_zone(key: str | None) -> bool:
    """ZoneInfo loads only a zone of the database: never a path or a package a payload names."""
    if key is None or len(key) > 64 or not _ZONE_KEY.fullmatch(key):
        return False  # segments of letters, digits, _ + -: no "..", no absolute path
    return key in zone_keys() or any(os.path.isfile(os.path.join(p, key)) for p in TZPATH)


@cache
def zone_keys() -> frozenset[str]:
    """The zones of the database (read once per process), less ``posix/...`` and ``right/...``."""
    return frozenset(available_timezones())


def _datetime_state(v: datetime) -> list[Any]:
    clock = [v.hour, v.minute, v.second, v.microsecond, v.fold]
    return [v.year, v.month, v.day, *clock, _tz_state(v.tzinfo)]


def _datetime(state: Any, _: Classes) -> datetime:
    year, month, day, hour, minute, second, micros, fold, tz = _list(state, 9)
    return datetime(year, month, day, hour, minute, second, micros, _tz(tz), fold=fold)


def _time_state(v: time) -> list[Any]:
    return [v.hour, v.minute, v.second, v.microsecond, v.fold, _tz_state(v.tzinfo)]


def _time(state: Any, _: Classes) -> time:
    hour, minute, second, micros, fold, tz = _list(state, 6)
    return time(hour, minute, second, micros, _tz(tz), fold=fold)


def _date(state: Any, _: Classes) -> date:
    return date(*_list(state, 3))


def _timedelta(state: Any, _: Classes) -> timedelta:
    days, seconds, micros = _list(state, 3)
    return timedelta(days=days, seconds=seconds, microseconds=micros)


def _int(state: Any, _: Classes) -> int:
    return int(_str(state), 16)  # base 16: no digit limit, linear time


def _pairs(state: Any, _: Classes) -> dict[Any, Any]:
    return dict(tuple(_list(pair, 2)) for pair in _list(state))


def _float(state: Any, _: Classes) -> float:
    if state not in ("inf", "-inf", "nan"):
        raise DecodeError("malformed", "a tagged float is inf, -inf or nan")
    return float(state)


def _bytes(state: Any, _: Classes) -> bytes:
    return base64.b64decode(_str(state), validate=True)


PAGE_METHOD = ("scrapy_playwright.page", "PageMethod")  # its module and name
# The page methods a queued request may name: they wait, read or act inside the page.
# None of them touches the worker's files (a "path" argument is refused too: screenshot
# and pdf write there) or the process: a payload names a method, which the renderer
# calls, so the list is closed. Others travel with SCHEDULER_SERIALIZER = 'signed_pickle'.
PAGE_METHODS = frozenset(
    [
        "check",
        "click",
        "content",
        "dblclick",
        "dispatch_event",
        "drag_and_drop",
        "emulate_media",
        "eval_on_selector",
        "eval_on_selector_all",
        "evaluate",
        "fill",
        "focus",
        "get_attribute",
        "go_back",
        "go_forward",
        "hover",
        "inner_html",
        "inner_text",
        "input_value",
        "is_checked",
        "is_disabled",
        "is_editable",
        "is_enabled",
        "is_hidden",
        "is_visible",
        "pdf",
        "press",
        "reload",
        "screenshot",
        "select_option",
        "set_checked",
        "set_default_navigation_timeout",
        "set_default_timeout",
        "set_extra_http_headers",
        "set_viewport_size",
        "tap",
        "text_content",
        "title",
        "type",
        "uncheck",
        "wait_for_event",
        "wait_for_function",
        "wait_for_load_state",
        "wait_for_selector",
        "wait_for_timeout",
        "wait_for_url",
    ]
)


def _page_method_refused(method: Any, kwargs: Any) -> str:
    """Why a page method may not travel; ``""`` if it may."""
    if not isinstance(method, str):
        return "give the page's method by name"
    if method not in PAGE_METHODS:
        return f"{method!r} is not among the page methods a queued request may name"
    if "path" in kwargs:
        return "a path on the worker's disk may not travel (take the result instead)"
    return ""


def _page_method_state(value: Any) -> list[Any]:
    refused = _page_method_refused(value.method, value.kwargs)
    if refused:
        raise EncodeError(
            f"a PageMethod of {value.method!r}: {refused}, or use"
            " SCHEDULER_SERIALIZER = 'signed_pickle' (docs/requests.md)"
        )
    return [value.method, list(value.args), dict(value.kwargs)]


def _page_method(state: Any, _: Classes) -> Any:
    module = sys.modules.get(PAGE_METHOD[0])
    if module is None:
        raise DecodeError(
            "unknown_class", "a PageMethod, and scrapy_playwright is not imported here"
        )
    method, args, kwargs = _list(state, 3)
    method, args, kwargs = _str(method), _list(args), _str_dict(kwargs)
    refused = _page_method_refused(method, kwargs)
    if refused:
        raise DecodeError("forbidden_class", f"a PageMethod: {refused}")
    return getattr(module, PAGE_METHOD[1])(method, *args, **kwargs)


def _json_only(value: Any) -> Any:
    raise AssertionError("JSON dumps this kind itself")  # pragma: no cover


TAGS = (
    Tag(1, "tuple", list, lambda s, _: tuple(_list(s))),
    Tag(2, "set", list, lambda s, _: set(_list(s))),
    Tag(3, "frozenset", list, lambda s, _: frozenset(_list(s))),
    Tag(4, "int", hex, _int),
    Tag(5, "datetime", _datetime_state, _datetime),
    Tag(6, "date", lambda v: [v.year, v.month, v.day], _date),
    Tag(7, "time", _time_state, _time),
    Tag(8, "timedelta", lambda v: [v.days, v.seconds, v.microseconds], _timedelta),
    Tag(9, "decimal", str, lambda s, _: Decimal(_str(s))),
    Tag(10, "uuid", lambda v: v.hex, lambda s, _: UUID(hex=_str(s))),
    _class_tag(11, "enum", ENUM),
    _class_tag(12, "item", ITEM),
    _class_tag(13, "dataclass", DATACLASS),
    _class_tag(14, "attrs", ATTRS),
    Tag(15, "page_method", _page_method_state, _page_method),
)
JSON_TAGS = (
    Tag(0, "dict", _json_only, _pairs),
    Tag(0, "float", _json_only, _float),
    Tag(0, "bytes", _json_only, _bytes),
)
BY_CODE = {tag.code: tag for tag in TAGS}
BY_NAME = {tag.name: tag for tag in TAGS + JSON_TAGS}
_BY_TYPE: dict[type, Tag] = {
    kind: BY_NAME[kind.__name__.lower()]
    for kind in (tuple, set, frozenset, int, datetime, date, time, timedelta, Decimal, UUID)
}
_CLASS_TAGS = {
    ENUM: BY_NAME["enum"],
    ITEM: BY_NAME["item"],
    DATACLASS: BY_NAME["dataclass"],
    ATTRS: BY_NAME["attrs"],
}
# a subclass of one of these travels as the base: the exact type, which msgpack carries
_BASES: dict[type, Callable[[Any], Any]] = {
    dict: dict,
    list: list,
    str: str.__str__,
    bytes: bytes.__bytes__,
    bytearray: bytes,
    memoryview: bytes,
    int: int.__int__,
    float: float.__float__,
}
UNSUPPORTED = (
    "which is not a kind the queue carries without pickle (docs/requests.md lists them):"
    " convert it, or use SCHEDULER_SERIALIZER = 'signed_pickle'"
)


def reduce(value: Any, classes: Classes) -> tuple[Tag | None, Any]:
    """``(tag, state)`` of a value msgpack does not carry itself; ``(None, plain)`` for a
    subclass of a plain type. Raises :class:`EncodeError` (without the value's path)."""
    cls = type(value)
    tag = _BY_TYPE.get(cls)
    if tag is not None:
        return tag, tag.state(value)
    kind = class_kind(cls)
    if kind is not None:
        classes.check(cls)
        tag = _CLASS_TAGS[kind]
        return tag, tag.state(value)
    if (cls.__module__, cls.__qualname__) == PAGE_METHOD:
        tag = BY_NAME["page_method"]
        return tag, tag.state(value)
    for base in cls.__mro__:
        if base in _BASES:
            return None, _BASES[base](value)
        if base in _BY_TYPE:
            return _BY_TYPE[base], _BY_TYPE[base].state(value)
    raise EncodeError(f"a {cls.__module__}.{cls.__qualname__}, {UNSUPPORTED}")


def build(tag: Tag, state: Any, classes: Classes) -> Any:
    try:
        return tag.build(state, classes)
    except DecodeError:
        raise
    except Exception as exc:  # the constructors' own checks: ranges, types, hashability
        raise DecodeError("malformed", f"bad {tag.name}: {type(exc).__name__}: {exc}") from exc


class _Nesting:
    """Counts tagged values inside tagged values, for one record."""

    def __init__(self, classes: Classes) -> None:
        self.classes = classes
        self.tagged = False
        self.depth = 0

    def enter(self, error: Callable[[str], Exception]) -> None:
        self.tagged = True
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise error(f"tagged values nested more than {MAX_DEPTH} deep")


def _too_deep(message: str) -> DecodeError:
    return DecodeError("too_deep", message)


# -- msgpack -----------------------------------------------------------------


class Packer(_Nesting):
    """Packs one record; ``tagged`` says whether it needed tagged values."""

    def pack(self, value: Any) -> bytes:
        return msgpack.packb(  # type: ignore[no-any-return]
            value, default=self._default, strict_types=True, use_bin_type=True
        )

    def _default(self, value: Any) -> Any:
        tag, state = reduce(value, self.classes)
        if tag is None:
            return state
        self.enter(lambda m: EncodeError(f"{m} (a cycle?)"))
        try:
            return msgpack.ExtType(tag.code, self.pack(state))
        finally:
            self.depth -= 1


class Unpacker(_Nesting):
    """Unpacks one record; ``tagged`` says whether it held tagged values."""

    def unpack(self, data: bytes) -> Any:
        # ext type -1 is msgpack's own timestamp: a datetime in UTC
        return msgpack.unpackb(
            data, raw=False, strict_map_key=False, timestamp=3, ext_hook=self._ext
        )

    def _ext(self, code: int, data: bytes) -> Any:
        tag = BY_CODE.get(code)
        if tag is None:
            raise DecodeError("unknown_tag", f"unknown tagged value (msgpack ext type {code})")
        self.enter(_too_deep)
        try:
            state = self.unpack(data)
        finally:
            self.depth -= 1
        return build(tag, state, self.classes)


# -- JSON --------------------------------------------------------------------


class JsonTree(_Nesting):
    """Values to a JSON-safe tree and back, with the same tags as ``{"$name": state}``."""

    def dump(self, value: Any) -> Any:
        kind = type(value)
        if value is None or kind is str or kind is bool or (kind is int and _fits(value)):
            return value
        if kind is list:
            return [self.dump(item) for item in value]
        if kind is dict:
            return self._dict(value)
        if kind is float or kind is bytes:
            return self._scalar(value)
        tag, state = reduce(value, self.classes)
        return self.dump(state) if tag is None else self._nest(tag.name, state)

    def _scalar(self, value: float | bytes) -> Any:
        if isinstance(value, bytes):
            return self._leaf("bytes", base64.b64encode(value).decode("ascii"))
        return value if math.isfinite(value) else self._leaf("float", repr(value))

    def _dict(self, value: dict[Any, Any]) -> Any:
        keys = list(value)
        if all(type(k) is str for k in keys) and not (len(keys) == 1 and keys[0][:1] == "$"):
            return {k: self.dump(v) for k, v in value.items()}
        return self._nest("dict", [[k, v] for k, v in value.items()])

    def _leaf(self, name: str, state: str) -> dict[str, str]:
        self.tagged = True
        return {f"${name}": state}

    def _nest(self, name: str, state: Any) -> dict[str, Any]:
        self.enter(lambda m: EncodeError(f"{m} (a cycle?)"))
        try:
            return {f"${name}": self.dump(state)}
        finally:
            self.depth -= 1

    def load(self, tree: Any) -> Any:
        if isinstance(tree, list):
            return [self.load(item) for item in tree]
        if not isinstance(tree, dict):
            return tree
        if len(tree) == 1:
            ((key, state),) = tree.items()
            if key[:1] == "$":
                return self._untag(key[1:], state)
        return {k: self.load(v) for k, v in tree.items()}

    def _untag(self, name: str, state: Any) -> Any:
        tag = BY_NAME.get(name)
        if tag is None:
            raise DecodeError("unknown_tag", f"unknown tagged value ${name[:40]}")
        self.enter(_too_deep)
        try:
            value = self.load(state)
        finally:
            self.depth -= 1
        return build(tag, value, self.classes)


# -- where an unsupported value sits -----------------------------------------

_NATIVE = (type(None), bool, str, bytes, float, dict, list)
_LOCATE_DEPTH = 300


def locate(roots: Mapping[str, Any], classes: Classes) -> tuple[str, str] | None:
    """``(path, reason)`` of the first value under ``roots`` that cannot be encoded."""
    for name, value in roots.items():
        found = _locate(value, name, classes, 0)
        if found is not None:
            return found
    return None


def _locate(value: Any, path: str, classes: Classes, depth: int) -> tuple[str, str] | None:
    if depth > _LOCATE_DEPTH:
        return path[:120] + "...", "values nested too deep (a cycle?)"
    if type(value) not in _NATIVE and not (type(value) is int and _fits(value)):
        try:
            reduce(value, classes)
        except EncodeError as exc:
            return path, str(exc)
    for subpath, child in _children(value, path):
        found = _locate(child, subpath, classes, depth + 1)
        if found is not None:
            return found
    return None


def _fits(value: int) -> bool:
    return MSGPACK_INTS[0] <= value < MSGPACK_INTS[1]


def _children(value: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):  # dicts and Items
        keys = [(f"a key of {path}", k) for k in value if type(k) is not str]
        return keys + [(f"{path}[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, list | tuple | set | frozenset):
        return [(f"{path}[{i}]", item) for i, item in enumerate(value)]
    kind = class_kind(type(value))
    if kind is DATACLASS or kind is ATTRS:
        return [(f"{path}.{k}", v) for k, v in kind.fields(value).items()]
    return []
