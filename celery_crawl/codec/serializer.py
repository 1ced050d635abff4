"""Requests to bytes and back: msgpack, JSON, or pickle signed with a secret.

A request becomes a positional record::

    [version, url, callback, errback, method, headers, body, cookies, meta,
     cb_kwargs, priority, flags, dont_filter, encoding, class]

with trailing default values left off. Callbacks travel by name and are
resolved only against the spider's own methods (see below); the request
class only against a fixed table.

The default codec encodes the record as msgpack, :class:`JsonCodec` as JSON.
Neither uses pickle: values beyond plain data (tuples, dates, Decimals,
Items, dataclasses...) travel as the tagged values of
:mod:`celery_crawl.codec.tags`, and a class is rebuilt only from the modules that
``SCHEDULER_ALLOWED_MODULES`` and ``SPIDER_MODULES`` allow. A record that
holds tagged values is version 2; one without is version 1, byte for byte
what earlier versions wrote and read. :class:`SignedPickleCodec` pickles the
record, for meta of any kind, and unpickles only what carries a valid
HMAC-SHA256 made with the crawl's secret. docs/requests.md has the threat
model.

Anything read back that does not fit raises :class:`DecodeError`, never
another exception. That includes a request whose URL scheme or method the
project does not allow (:class:`RequestPolicy`: ``SCHEDULER_ALLOWED_SCHEMES``,
``SCHEDULER_ALLOWED_METHODS``): whoever writes to Redis cannot make a worker
read ``file://`` or ``s3://`` URLs, or send a ``PUT``.

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
import hashlib
import hmac
import inspect
import json
import os
import pickle
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest

from celery_crawl.codec import tags
from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.errors import ConfigError, DecodeError, EncodeError

VERSION = 1  # what to_record writes: plain values only
TAGGED_VERSION = 2  # meta, cb_kwargs or cookies hold tagged values
VERSIONS = (VERSION, TAGGED_VERSION)
TAGGED_FROM = 7  # record index of the first field that may hold tagged values (cookies)
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


# scrapy-playwright's browser context options that a request read back may ask for
# (``meta["playwright_context_kwargs"]``): how pages look and behave. Left out: what
# reaches the worker's files or programs (``user_data_dir``, which launches a browser
# with options of its own, ``record_har_path``, ``record_video_dir``,
# ``client_certificates``), and ``storage_state`` as a path.
BROWSER_CONTEXT_OPTIONS = frozenset(
    """accept_downloads base_url bypass_csp color_scheme contrast device_scale_factor
    extra_http_headers forced_colors geolocation has_touch http_credentials
    ignore_https_errors is_mobile java_script_enabled locale no_viewport offline
    permissions proxy reduced_motion screen service_workers storage_state
    strict_selectors timezone_id user_agent viewport""".split()  # noqa: SIM905
)


def check_browser_meta(meta: dict[str, Any]) -> None:
    """:class:`DecodeError` ``refused_meta`` when a request read back carries
    scrapy-playwright meta that would make its renderer import by name, start a
    program or touch the worker's files."""
    if "playwright_page_init_callback" in meta:
        raise DecodeError(
            "refused_meta",
            "meta['playwright_page_init_callback']: a callback named in queued data would be"
            " imported by name; use page methods instead (docs/requests.md)",
        )
    options = meta.get("playwright_context_kwargs")
    if options is None:
        return
    unknown = sorted(set(options) - BROWSER_CONTEXT_OPTIONS) if isinstance(options, dict) else []
    if not isinstance(options, dict):
        refused = "not a dict of options"
    elif unknown:
        refused = f"{unknown} may not come from the queue"
    elif isinstance(options.get("storage_state"), str):
        refused = "storage_state as a path may not come from the queue"
    else:
        return
    raise DecodeError(
        "refused_meta",
        f"meta['playwright_context_kwargs']: {refused}; options that reach the worker's files"
        " or programs go in PLAYWRIGHT_CONTEXTS, a named context that the request names"
        " (playwright_context; docs/requests.md)",
    )


@dataclass(frozen=True)
class RequestPolicy:
    """The URL schemes (lower case) and methods (upper case) a request read back may use,
    and no scrapy-playwright meta that reaches beyond the page (:func:`check_browser_meta`)."""

    schemes: frozenset[str] = frozenset(SETTINGS["SCHEDULER_ALLOWED_SCHEMES"].default)
    methods: frozenset[str] = frozenset(SETTINGS["SCHEDULER_ALLOWED_METHODS"].default)

    @classmethod
    def from_settings(cls, settings: Any) -> RequestPolicy:
        schemes = setting(settings, "SCHEDULER_ALLOWED_SCHEMES")
        methods = setting(settings, "SCHEDULER_ALLOWED_METHODS")
        return cls(frozenset(map(str.lower, schemes)), frozenset(map(str.upper, methods)))

    def check(self, request: Request) -> Request:
        """``request``, or :class:`DecodeError` ``refused_scheme`` / ``refused_method``."""
        scheme = urlsplit(request.url).scheme.lower()
        if scheme not in self.schemes:
            allowed = sorted(self.schemes)
            raise DecodeError(
                "refused_scheme", f"URL scheme {scheme!r} is not allowed (allowed: {allowed})"
            )
        if request.method.upper() not in self.methods:
            allowed = sorted(self.methods)
            raise DecodeError(
                "refused_method", f"method {request.method!r} is not allowed (allowed: {allowed})"
            )
        check_browser_meta(request.meta)
        return request


DEFAULT_POLICY = RequestPolicy()


class Codec(Protocol):
    name: str
    policy: RequestPolicy

    def encode(self, request: Request, spider: Spider) -> bytes: ...

    def decode(self, data: bytes, spider: Spider) -> Request: ...


_NAMES: dict[tuple[type, Any], str] = {}  # (spider class, function) -> its name on the class
_NAMES_MAX = 4096


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
    key = (type(spider), func.__func__)
    known = _NAMES.get(key)
    if known is not None and known not in vars(spider):  # as the class defines it: unchanged
        return known
    for name in _candidate_names(func, spider):
        if _is_method_of(spider, name, func):
            if name not in vars(spider):  # an instance attribute may change; a class's does not
                if len(_NAMES) >= _NAMES_MAX:
                    _NAMES.clear()
                _NAMES[key] = name
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


# methods every spider has that Scrapy calls for itself: named by a queued request, as its
# callback or a page event handler, one would be called with a response or a page event
SPIDER_LIFECYCLE = frozenset({"start", "start_requests", "_set_crawler", "log"})


def resolve_method(spider: Spider, name: str) -> Callable[..., Any]:
    """The method ``name`` of this spider instance, the way Scrapy resolves it, and nothing else.

    Never imports: ``name`` is only looked up on ``spider``, and the result must be a
    method bound to ``spider``. Special names, properties and names found nowhere (which
    ``__getattr__`` would answer) are refused without running any code.
    """
    if not name.isidentifier() or (name.startswith("__") and name.endswith("__")):
        raise DecodeError("unknown_callback", f"{name!r} is not a callback name")
    if name in SPIDER_LIFECYCLE:
        raise DecodeError("unknown_callback", f"{name!r} is Scrapy's, not a callback")
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


# meta that belongs to the process that set it, never to the queue: scrapy-playwright's
# live page (``playwright_include_page``), which a retry of the request carries. Left
# out, the process that renders the request next opens a page of its own.
LOCAL_META = "playwright_page"


# scrapy-playwright's page event handlers: a function, or a name it finds with
# getattr(spider, name). A handler that is a method of the spider is queued as its name.
EVENT_HANDLERS_META = "playwright_page_event_handlers"


def _queued_meta(meta: dict[str, Any], spider: Spider) -> dict[str, Any]:
    if LOCAL_META not in meta and EVENT_HANDLERS_META not in meta:
        return meta  # nearly always: the meta as it is
    queued = {key: value for key, value in meta.items() if key != LOCAL_META}
    handlers = meta.get(EVENT_HANDLERS_META)
    if isinstance(handlers, dict):
        queued[EVENT_HANDLERS_META] = {
            event: method_name(handler, spider) if _own_method(handler, spider) else handler
            for event, handler in handlers.items()
        }
    return queued


def _own_method(handler: Any, spider: Spider) -> bool:
    return inspect.ismethod(handler) and handler.__self__ is spider


def event_handler_names(meta: dict[str, Any], spider: Spider) -> None:
    """:class:`DecodeError` ``refused_meta`` unless every page event handler in ``meta`` is
    the name of a method of ``spider``, as a callback is: found by name, a name from the
    queue could otherwise reach any attribute of the spider. The ``msgpack`` and ``json``
    codecs check it both ways (``signed_pickle``'s entries are trusted: they carry
    functions too)."""
    handlers = meta.get(EVENT_HANDLERS_META)
    if handlers is None:
        return
    named = isinstance(handlers, dict) and all(
        isinstance(event, str) and isinstance(name, str) for event, name in handlers.items()
    )
    try:
        if not named:
            raise DecodeError(
                "refused_meta", "give each handler as a method of the spider, or its name"
            )
        for name in handlers.values():
            resolve_method(spider, name)
    except DecodeError as exc:
        raise DecodeError("refused_meta", f"meta[{EVENT_HANDLERS_META!r}]: {exc}") from exc


def to_record(request: Request, spider: Spider, *, named: bool = True) -> list[Any]:
    """The request as a record; ``named``: its page event handlers must be spider methods
    (:func:`event_handler_names`), refused when yielded as they would be when read back."""
    cls_name = type(request).__name__
    if REQUEST_CLASSES.get(cls_name) is not type(request):
        raise EncodeError(f"request class {type(request).__qualname__} is not supported")
    meta = _queued_meta(request.meta, spider)
    if named and EVENT_HANDLERS_META in meta:
        try:
            event_handler_names(meta, spider)
        except DecodeError as exc:
            raise EncodeError(str(exc)) from exc
    values = [
        method_name(request.callback, spider),
        method_name(request.errback, spider),
        request.method,
        {k: list(v) for k, v in request.headers.items()},
        request.body,
        request.cookies,
        meta,
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


def from_record(
    record: Any, spider: Spider, policy: RequestPolicy = DEFAULT_POLICY, *, named: bool = True
) -> Request:
    if not isinstance(record, list) or len(record) < 2 or record[0] not in VERSIONS:
        raise DecodeError("malformed", "not a request record of version 1 or 2")
    if len(record) > 2 + len(FIELDS):
        raise DecodeError("malformed", "request record has extra fields")
    fields = {name: default for name, default in FIELDS}
    fields.update(zip((name for name, _ in FIELDS), record[2:], strict=False))
    check_types(record[1], fields)
    if named and EVENT_HANDLERS_META in fields["meta"]:
        event_handler_names(fields["meta"], spider)
    return policy.check(build_request(record[1], fields, spider))


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


def encode_error(request: Request, exc: EncodeError, classes: tags.Classes) -> EncodeError:
    """``exc``, saying where in the request the value sits that cannot be encoded."""
    roots = {"meta": request.meta, "cb_kwargs": request.cb_kwargs, "cookies": request.cookies}
    found = tags.locate(roots, classes)
    where = f"{found[0]} holds {found[1]}" if found is not None else str(exc)
    return EncodeError(f"cannot encode {request}: {where}")


class MsgpackCodec:
    """The default: compact, carries bytes natively, and tagged values as msgpack ext types."""

    name = "msgpack"

    def __init__(
        self, classes: tags.Classes | None = None, policy: RequestPolicy = DEFAULT_POLICY
    ) -> None:
        self.classes = classes if classes is not None else tags.Classes()
        self.policy = policy

    def encode(self, request: Request, spider: Spider) -> bytes:
        record = to_record(request, spider)
        packer = tags.Packer(self.classes)
        data = self._pack(packer, record, request)
        if packer.tagged:  # written again as version 2, which a version-1 reader refuses
            record[0] = TAGGED_VERSION
            data = self._pack(tags.Packer(self.classes), record, request)
        return data

    def _pack(self, packer: tags.Packer, record: list[Any], request: Request) -> bytes:
        try:
            return packer.pack(record)
        except EncodeError as exc:
            raise encode_error(request, exc, self.classes) from exc
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise EncodeError(f"cannot encode {request}: {exc}") from exc

    def decode(self, data: bytes, spider: Spider) -> Request:
        unpacker = tags.Unpacker(self.classes)
        try:
            record = unpacker.unpack(data)
        except DecodeError:
            raise
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise DecodeError("undecodable", f"not msgpack: {type(exc).__name__}") from exc
        if unpacker.tagged and isinstance(record, list) and record[:1] == [VERSION]:
            raise DecodeError("malformed", "a version-1 record holds tagged values")
        return from_record(record, spider, self.policy)


class JsonCodec:
    """Readable entries: header and body bytes as base64, tagged values as ``{"$kind": ...}``."""

    name = "json"

    def __init__(
        self, classes: tags.Classes | None = None, policy: RequestPolicy = DEFAULT_POLICY
    ) -> None:
        self.classes = classes if classes is not None else tags.Classes()
        self.policy = policy

    def encode(self, request: Request, spider: Spider) -> bytes:
        record = to_record(request, spider)
        tree = tags.JsonTree(self.classes)
        try:
            record[TAGGED_FROM:] = [tree.dump(value) for value in record[TAGGED_FROM:]]
        except EncodeError as exc:
            raise encode_error(request, exc, self.classes) from exc
        except RecursionError as exc:
            raise EncodeError(f"cannot encode {request}: {exc}") from exc
        if tree.tagged:
            record[0] = TAGGED_VERSION
        if len(record) > 5:
            record[5] = {_b64(k): [_b64(v) for v in vs] for k, vs in record[5].items()}
        if len(record) > 6:
            record[6] = _b64(record[6])
        try:
            return json.dumps(record, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise EncodeError(f"cannot encode {request}: {exc}") from exc

    def decode(self, data: bytes, spider: Spider) -> Request:
        try:
            record = self._record(data)
        except DecodeError:
            raise
        except Exception as exc:
            raise DecodeError("undecodable", f"not a JSON request record: {exc}") from exc
        return from_record(record, spider, self.policy)

    def _record(self, data: bytes) -> Any:
        record = json.loads(data)
        if not isinstance(record, list):
            return record
        if len(record) > 5:
            record[5] = {_unb64(k): [_unb64(v) for v in vs] for k, vs in record[5].items()}
        if len(record) > 6:
            record[6] = _unb64(record[6])
        if record[:1] == [TAGGED_VERSION]:  # version 1 meta is plain, "$" keys and all
            tree = tags.JsonTree(self.classes)
            record[TAGGED_FROM:] = [tree.load(value) for value in record[TAGGED_FROM:]]
        return record


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _unb64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise DecodeError("malformed", "expected a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise DecodeError("malformed", "invalid base64") from exc


MIN_SECRET_BYTES = 16
SECRET_HOWTO = (
    "set SCHEDULER_PICKLE_SECRET, in the settings or the environment of every process of the"
    " crawl, to one long random string, e.g. the output of"
    ' `python -c "import secrets; print(secrets.token_hex(32))"`; or use'
    " SCHEDULER_SERIALIZER = 'msgpack', which needs no secret (see docs/requests.md)"
)


class SignedPickleCodec:
    """Meta of any picklable kind, for a Redis that only the crawl's own processes can write.

    An entry is ``MAGIC + HMAC-SHA256(secret, MAGIC + body) + body``, ``body`` the pickled
    record. Decoding compares the MAC in constant time before anything is unpickled: an
    entry without one, or with a wrong one (forged, or made with another secret), is
    refused with :class:`DecodeError`, and the scheduler dead-letters it.
    """

    name = "signed_pickle"
    MAGIC = b"ccsp1:"

    def __init__(self, secret: str | bytes | None, policy: RequestPolicy = DEFAULT_POLICY) -> None:
        self.policy = policy
        if not secret:
            raise ConfigError(
                "SCHEDULER_SERIALIZER 'signed_pickle' ('scrapy_redis.picklecompat' means it too)"
                f" signs every queue entry and needs a secret: {SECRET_HOWTO}"
            )
        key = secret.encode() if isinstance(secret, str) else secret
        if len(key) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"SCHEDULER_PICKLE_SECRET is shorter than {MIN_SECRET_BYTES} bytes: {SECRET_HOWTO}"
            )
        self._key = key
        self._head = len(self.MAGIC) + hashlib.sha256().digest_size

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, self.MAGIC + body, hashlib.sha256).digest()

    def encode(self, request: Request, spider: Spider) -> bytes:
        record = to_record(request, spider, named=False)
        try:
            body = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # PicklingError, TypeError, AttributeError...: one meaning
            raise EncodeError(f"cannot pickle {request}: {type(exc).__name__}: {exc}") from exc
        return self.MAGIC + self._mac(body) + body

    def decode(self, data: bytes, spider: Spider) -> Request:
        if len(data) <= self._head or not data.startswith(self.MAGIC):
            raise DecodeError("unsigned", "not a signed entry; it was not unpickled")
        mac, body = data[len(self.MAGIC) : self._head], data[self._head :]
        if not hmac.compare_digest(mac, self._mac(body)):
            raise DecodeError(
                "bad_signature",
                "the signature does not match (forged, or made with another"
                " SCHEDULER_PICKLE_SECRET); it was not unpickled",
            )
        try:
            record = pickle.loads(body)
        except Exception as exc:  # signed by us, but made by another version of the code
            raise DecodeError("undecodable", f"signed, but {type(exc).__name__}: {exc}") from exc
        return from_record(record, spider, self.policy, named=False)


# SCHEDULER_SERIALIZER -> the codec, from the allowed classes, the secret and the policy
CODECS: dict[str, Callable[[tags.Classes, str | None, RequestPolicy], Codec]] = {
    "msgpack": lambda classes, _, policy: MsgpackCodec(classes, policy),
    "json": lambda classes, _, policy: JsonCodec(classes, policy),
    "signed_pickle": lambda _, secret, policy: SignedPickleCodec(secret, policy),
    # the scrapy-redis name: pickle, which is read back here only when signed
    "scrapy_redis.picklecompat": lambda _, secret, policy: SignedPickleCodec(secret, policy),
}


def codec_from_name(
    name: str | None,
    *,
    allowed_modules: Iterable[str] = (),
    secret: str | None = None,
    policy: RequestPolicy = DEFAULT_POLICY,
) -> Codec:
    """``SCHEDULER_SERIALIZER``: ``msgpack`` (default), ``json`` or ``signed_pickle``."""
    key = name or SETTINGS["SCHEDULER_SERIALIZER"].default
    if key not in CODECS:
        raise ConfigError(
            f"SCHEDULER_SERIALIZER {key!r} is not supported; use 'msgpack', 'json' or"
            " 'signed_pickle' (unsigned pickle is never read back from Redis)"
        )
    return CODECS[key](tags.Classes(allowed_modules), secret, policy)


def codec_from_settings(settings: Any, spidercls: type | None = None) -> Codec:
    """The codec ``SCHEDULER_SERIALIZER`` names, with its allowed modules or its secret."""
    secret = setting(settings, "SCHEDULER_PICKLE_SECRET") or os.environ.get(
        "SCHEDULER_PICKLE_SECRET"
    )
    return codec_from_name(
        setting(settings, "SCHEDULER_SERIALIZER"),
        allowed_modules=allowed_modules(settings, spidercls),
        secret=secret,
        policy=RequestPolicy.from_settings(settings),
    )


def allowed_modules(settings: Any, spidercls: type | None = None) -> list[str]:
    """``SCHEDULER_ALLOWED_MODULES``, the package of each module of ``SPIDER_MODULES``, and
    the spider's own module's package (the module itself when it is in none).

    ``SPIDER_MODULES = ["myproject.spiders"]`` allows ``myproject`` and what is below it;
    ``scrapy runspider myspider.py`` allows ``myspider``, where its Items are.
    """
    spiders = settings.getlist("SPIDER_MODULES") if hasattr(settings, "getlist") else []
    if spidercls is not None:
        spiders = [*spiders, spidercls.__module__]
    packages = [name.rpartition(".")[0] or name for name in spiders]
    return [*packages, *setting(settings, "SCHEDULER_ALLOWED_MODULES")]
