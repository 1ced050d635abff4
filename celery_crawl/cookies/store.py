"""Shared cookie jars in Redis: cookies as JSON, never pickle.

Layout: a jar is a hash (``SpiderKeys.cookie_jar``, in the spider's hash tag)
of ``domain|path|name`` -> the cookie as JSON (:func:`encode_cookie`), plus
the field ``~version``, which every change sets to a larger number. The jar
expires ``COOKIES_SHARED_TTL`` seconds after its last change.

A change is one call of ``cookies/lua/cookies_write.lua`` (store, delete, new
version, expiry); a read is one call of ``cookies/lua/cookies_read.lua``, which sends
the cookies only when the caller's version is out of date. What comes back
is checked field by field: a malformed cookie raises :class:`CookieError`
in :func:`decode_cookie`, and :meth:`CookieStore.read` skips and counts it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.cookiejar import Cookie
from types import NoneType

import redis

from celery_crawl.core import scripts
from celery_crawl.core.errors import CookieError
from celery_crawl.core.scripts import Argv

VERSION_FIELD = "~version"
READ = Argv("cookies_read", ("version",))
WRITE = Argv(
    "cookies_write",
    ("seconds_kept", "cookies_to_store"),
    (("field", "json"),),
    ("fields_to_delete",),
)

# Cookie's constructor arguments, in order, with the types a stored value may have
_ATTRIBUTES: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("version", (int, NoneType)),
    ("name", (str,)),
    ("value", (str, NoneType)),
    ("port", (str, NoneType)),
    ("port_specified", (bool,)),
    ("domain", (str,)),
    ("domain_specified", (bool,)),
    ("domain_initial_dot", (bool,)),
    ("path", (str,)),
    ("path_specified", (bool,)),
    ("secure", (bool,)),
    ("expires", (int, float, NoneType)),
    ("discard", (bool,)),
    ("comment", (str, NoneType)),
    ("comment_url", (str, NoneType)),
    ("rest", (dict,)),
    ("rfc2109", (bool,)),
)


def cookie_field(cookie: Cookie) -> str:
    """The cookie's field in its jar: two cookies with the same field replace each other."""
    return f"{cookie.domain}|{cookie.path}|{cookie.name}"


def encode_cookie(cookie: Cookie) -> str:
    """Every attribute of ``cookie`` as a JSON object."""
    values = {name: getattr(cookie, name) for name, _ in _ATTRIBUTES if name != "rest"}
    values["rest"] = dict(getattr(cookie, "_rest", {}))
    return json.dumps(values, sort_keys=True, separators=(",", ":"))


def decode_cookie(text: bytes | str) -> Cookie:
    """A cookie from :func:`encode_cookie`'s JSON; anything else raises :class:`CookieError`."""
    try:
        values = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CookieError(f"a shared cookie is not JSON: {exc}") from None
    if not isinstance(values, dict):
        raise CookieError(f"a shared cookie is a {type(values).__name__}, not an object")
    for name, kinds in _ATTRIBUTES:
        if not isinstance(values.get(name), kinds):
            raise CookieError(f"a shared cookie's {name!r} is {values.get(name)!r}")
    rest = values["rest"]
    if not all(isinstance(v, str | NoneType) for v in rest.values()):
        raise CookieError(f"a shared cookie's attributes are not all text: {rest!r}")
    return Cookie(*(values[name] for name, _ in _ATTRIBUTES))


@dataclass
class JarState:
    """A jar as read from Redis: its version, its cookies, and how many were malformed."""

    version: int
    cookies: list[Cookie] = field(default_factory=list)
    malformed: int = 0


class CookieStore:
    """The shared jars of one Redis; each call is one round trip."""

    def __init__(self, client: redis.Redis, ttl: int) -> None:
        self.client = client
        self.ttl = ttl

    def read(self, key: str, known: int = 0) -> JarState | None:
        """The jar at ``key``; None when its version is still ``known``."""
        args = READ.build(version=str(known))
        reply = scripts.script(self.client, READ.script)(keys=[key], args=args)
        version = int(reply[0])
        if version == known and len(reply) == 1:
            return None
        state = JarState(version)
        for value in reply[2::2]:
            try:
                state.cookies.append(decode_cookie(value))
            except CookieError:
                state.malformed += 1
        return state

    def write(
        self, key: str, store: Mapping[str, str], delete: Sequence[str] = ()
    ) -> tuple[int, int]:
        """Store and delete cookies; returns the jar's new version and the one before."""
        args = WRITE.build(seconds_kept=self.ttl, cookies_to_store=len(store))
        args += WRITE.each(0, field=list(store), json=list(store.values()))
        args += WRITE.rest(fields_to_delete=delete)
        new, previous = scripts.script(self.client, WRITE.script)(keys=[key], args=args)
        return int(new), int(previous)
