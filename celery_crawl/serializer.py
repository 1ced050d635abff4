"""Requests to bytes and back, without pickle or eval.

A request becomes a positional record::

    [1, url, callback, errback, method, headers, body, cookies, meta,
     cb_kwargs, priority, flags, dont_filter, encoding, class]

with trailing default values left off, then encoded as msgpack (the
default) or JSON. The request class is resolved only against a fixed table.
Anything read back that does not fit raises :class:`DecodeError`, never
another exception.

Callbacks and errbacks follow Scrapy's own rule (``Request.to_dict`` and
``request_from_dict``): any method of the spider instance, public, private,
name-mangled or inherited from Scrapy's classes (``CrawlSpider._callback``,
``SitemapSpider._parse_sitemap``) travels by the name it has on the spider.
A name read back is looked up only as an attribute of the spider instance and
accepted only if that attribute is a method bound to that same spider: nothing
is imported, no module function or class is ever reached, properties are not
evaluated, and special names (``__init__``) are refused.
"""

from __future__ import annotations

import base64
import functools
import inspect
import json
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import msgpack
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest

from celery_crawl.defaults import SETTINGS
from celery_crawl.errors import ConfigError, DecodeError, EncodeError

VERSION = 1
REQUEST_CLASSES: dict[str, type[Request]] = {
    "Request": Request,
    "FormRequest": FormRequest,
    "JsonRequest": JsonRequest,
}
# (field, default) in record order, after the version and the url
FIELDS: tuple[tuple[str, Any], ...] = (
    ("callback", None),
    ("errback", None),
    ("method", "GET"),
    ("headers", {}),
    ("body", b""),
    ("cookies", {}),
    ("meta", {}),
    ("cb_kwargs", {}),
    ("priority", 0),
    ("flags", []),
    ("dont_filter", False),
    ("encoding", "utf-8"),
    ("class", "Request"),
)


class Codec(Protocol):
    name: str

    def encode(self, request: Request, spider: Spider) -> bytes: ...

    def decode(self, data: bytes, spider: Spider) -> Request: ...


def method_name(func: Callable[..., Any] | None, spider: Spider) -> str | None:
    """The name under which ``func``, a method of ``spider``, is found on it again."""
    if func is None:
        return None
    if not inspect.ismethod(func) or func.__self__ is not spider:
        raise EncodeError(
            f"callback {func!r} is not a method of spider {spider.name!r}: queued requests"
            " name their callback and errback, so use a method of the spider itself"
            " (not a function, a lambda, a partial or another object's method)"
        )
    for name in _candidate_names(func, spider):
        if _is_method_of(spider, name, func):
            return name
    raise EncodeError(f"callback {func!r} cannot be found by name on spider {spider.name!r}")


def _candidate_names(func: Callable[..., Any], spider: Spider) -> Iterator[str]:
    """Its own name, its name-mangled forms (``__name`` in a class body), then any attribute."""
    name = str(getattr(func, "__name__", ""))
    yield name
    if name.startswith("__") and not name.endswith("__"):
        yield from (f"_{klass.__name__.lstrip('_')}{name}" for klass in type(spider).__mro__)
    yield from dir(spider)  # an alias, or a decorator that renamed the function


def _is_method_of(spider: Spider, name: str, func: Callable[..., Any]) -> bool:
    try:
        own = resolve_method(spider, name)
    except DecodeError:
        return False
    return getattr(own, "__func__", None) is getattr(func, "__func__", func)


def resolve_method(spider: Spider, name: str) -> Callable[..., Any]:
    """The method ``name`` of this spider instance, the way Scrapy resolves it, and nothing else.

    Never imports: ``name`` is only looked up on ``spider``, and the result must be a
    method bound to ``spider``. Special names, properties and names found nowhere (which
    ``__getattr__`` would answer) are refused without running any code.
    """
    if not name.isidentifier() or (name.startswith("__") and name.endswith("__")):
        raise DecodeError("unknown_callback", f"{name!r} is not a callback name")
    on_class = _class_attribute(type(spider).__mro__, name)
    if on_class is _UNSAFE or (on_class is None and name not in vars(spider)):
        raise DecodeError("unknown_callback", f"spider {spider.name!r} has no method {name!r}")
    method = getattr(spider, name)
    if not inspect.ismethod(method) or method.__self__ is not spider:
        raise DecodeError("unknown_callback", f"{name!r} is not a method of spider {spider.name!r}")
    return method


_UNSAFE = object()


@functools.lru_cache(maxsize=4096)
def _class_attribute(mro: tuple[type, ...], name: str) -> object | None:
    """``name`` as the classes define it; ``_UNSAFE`` if reading it runs code (a property)."""
    for klass in mro:
        if name in vars(klass):
            found = vars(klass)[name]
            data_descriptor = hasattr(type(found), "__set__") or hasattr(type(found), "__delete__")
            cached = isinstance(found, functools.cached_property)
            return _UNSAFE if data_descriptor or cached else found
    return None


def to_record(request: Request, spider: Spider) -> list[Any]:
    cls_name = type(request).__name__
    if REQUEST_CLASSES.get(cls_name) is not type(request):
        raise EncodeError(f"request class {type(request).__qualname__} is not supported")
    values = [
        method_name(request.callback, spider),
        method_name(request.errback, spider),
        request.method,
        {k: list(v) for k, v in request.headers.items()},
        request.body,
        request.cookies,
        request.meta,
        request.cb_kwargs,
        request.priority,
        request.flags,
        request.dont_filter,
        request.encoding,
        cls_name,
    ]
    while values and values[-1] == FIELDS[len(values) - 1][1]:
        values.pop()
    return [VERSION, request.url, *values]


def from_record(record: Any, spider: Spider) -> Request:
    if not isinstance(record, list) or len(record) < 2 or record[0] != VERSION:
        raise DecodeError("malformed", "not a version-1 request record")
    if len(record) > 2 + len(FIELDS):
        raise DecodeError("malformed", "request record has extra fields")
    fields = {name: default for name, default in FIELDS}
    fields.update(zip((name for name, _ in FIELDS), record[2:], strict=False))
    check_types(record[1], fields)
    return build_request(record[1], fields, spider)


_TYPES: dict[str, type | tuple[type, ...]] = {
    "callback": (str, type(None)),
    "errback": (str, type(None)),
    "method": str,
    "headers": dict,
    "body": bytes,
    "cookies": (dict, list),
    "meta": dict,
    "cb_kwargs": dict,
    "priority": int,
    "flags": list,
    "dont_filter": bool,
    "encoding": str,
    "class": str,
}


def check_types(url: Any, fields: dict[str, Any]) -> None:
    if not isinstance(url, str):
        raise DecodeError("malformed", "url is not a string")
    for name, expected in _TYPES.items():
        if not isinstance(fields[name], expected):
            raise DecodeError("malformed", f"field {name!r} has type {type(fields[name]).__name__}")
    for key, value in fields["headers"].items():
        if not isinstance(key, bytes) or not isinstance(value, list):
            raise DecodeError("malformed", "headers must map bytes to lists")
    if not all(isinstance(k, str) for k in fields["cb_kwargs"]):
        raise DecodeError("malformed", "cb_kwargs keys must be strings")


def build_request(url: str, fields: dict[str, Any], spider: Spider) -> Request:
    cls = REQUEST_CLASSES.get(fields["class"])
    if cls is None:
        raise DecodeError("unknown_class", f"request class {fields['class']!r} is not allowed")
    callback, errback = fields["callback"], fields["errback"]
    try:
        return cls(
            url,
            callback=resolve_method(spider, callback) if callback else None,
            errback=resolve_method(spider, errback) if errback else None,
            method=fields["method"],
            headers=fields["headers"],
            body=fields["body"],
            cookies=fields["cookies"],
            meta=fields["meta"],
            cb_kwargs=fields["cb_kwargs"],
            priority=fields["priority"],
            flags=fields["flags"],
            dont_filter=fields["dont_filter"],
            encoding=fields["encoding"],
        )
    except DecodeError:
        raise
    except Exception as exc:  # Request's own validation: bad URL, bad header values...
        raise DecodeError("invalid_request", f"{type(exc).__name__}: {exc}") from exc


class MsgpackCodec:
    """The default: compact, and carries bytes natively."""

    name = "msgpack"

    def encode(self, request: Request, spider: Spider) -> bytes:
        try:
            return msgpack.packb(to_record(request, spider), use_bin_type=True)  # type: ignore[no-any-return]
        except (TypeError, ValueError, OverflowError) as exc:
            raise EncodeError(f"cannot encode {request}: {exc}") from exc

    def decode(self, data: bytes, spider: Spider) -> Request:
        try:
            record = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise DecodeError("undecodable", f"not msgpack: {type(exc).__name__}") from exc
        return from_record(record, spider)


class JsonCodec:
    """Readable entries; header and body bytes travel as base64 strings."""

    name = "json"

    def encode(self, request: Request, spider: Spider) -> bytes:
        record = to_record(request, spider)
        if len(record) > 5:
            record[5] = {_b64(k): [_b64(v) for v in vs] for k, vs in record[5].items()}
        if len(record) > 6:
            record[6] = _b64(record[6])
        try:
            return json.dumps(record, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise EncodeError(f"cannot encode {request}: {exc}") from exc

    def decode(self, data: bytes, spider: Spider) -> Request:
        try:
            record = json.loads(data)
            if isinstance(record, list) and len(record) > 5:
                record[5] = {_unb64(k): [_unb64(v) for v in vs] for k, vs in record[5].items()}
            if isinstance(record, list) and len(record) > 6:
                record[6] = _unb64(record[6])
        except DecodeError:
            raise
        except Exception as exc:
            raise DecodeError("undecodable", f"not a JSON request record: {exc}") from exc
        return from_record(record, spider)


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _unb64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise DecodeError("malformed", "expected a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise DecodeError("malformed", "invalid base64") from exc


CODECS: dict[str, type[MsgpackCodec] | type[JsonCodec]] = {
    "msgpack": MsgpackCodec,
    "json": JsonCodec,
    # scrapy-redis names, so its settings carry over
    "scrapy_redis.picklecompat": MsgpackCodec,
}


def codec_from_name(name: str | None) -> Codec:
    """``SCHEDULER_SERIALIZER``: ``msgpack`` (default) or ``json``."""
    key = name or SETTINGS["SCHEDULER_SERIALIZER"].default
    if key not in CODECS:
        raise ConfigError(
            f"SCHEDULER_SERIALIZER {key!r} is not supported; use 'msgpack' or 'json' "
            "(pickle is never used on data read back from Redis)"
        )
    return CODECS[key]()
