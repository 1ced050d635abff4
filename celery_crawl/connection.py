"""One Redis connection pool per process, shared by every component.

Settings: ``REDIS_URL`` (``redis://``, ``rediss://`` or ``unix://``) and
``REDIS_PARAMS`` (keyword arguments for ``redis.Redis``), as in scrapy-redis.
Transient connection errors are retried with jittered exponential backoff;
what still fails surfaces as :class:`~celery_crawl.errors.RedisUnavailable`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from celery_crawl.errors import ConfigError, RedisUnavailable

DEFAULT_URL = "redis://localhost:6379/0"
DEFAULT_PARAMS: dict[str, Any] = {
    "socket_connect_timeout": 5,
    "socket_timeout": 30,
    "health_check_interval": 30,
}
_SCHEMES = ("redis", "rediss", "unix")

_clients: dict[tuple[int, str, str], redis.Redis] = {}
_lock = threading.Lock()


def redact(url: str) -> str:
    """The URL with any password replaced, fit for error messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def url_from_settings(settings: Any) -> str:
    url = settings.get("REDIS_URL")
    if not url and settings.get("REDIS_HOST"):
        url = f"redis://{settings.get('REDIS_HOST')}:{settings.getint('REDIS_PORT', 6379)}/0"
    url = str(url or os.environ.get("REDIS_URL") or DEFAULT_URL)
    if urlsplit(url).scheme not in _SCHEMES:
        raise ConfigError(f"REDIS_URL {redact(url)!r} must start with one of {_SCHEMES}")
    return url


def get_redis(url: str = DEFAULT_URL, params: dict[str, Any] | None = None) -> redis.Redis:
    """The process's client for ``url``; created once, then shared."""
    merged = {**DEFAULT_PARAMS, **(params or {})}
    merged.pop("redis_cls", None)  # scrapy-redis import-by-name hook: not supported
    cache_key = (os.getpid(), url, repr(sorted(merged.items())))
    with _lock:
        client = _clients.get(cache_key)
        if client is None:
            retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), retries=5)
            client = redis.Redis.from_url(url, retry=retry, **merged)
            _clients[cache_key] = client
    return client


def from_settings(settings: Any) -> redis.Redis:
    params = settings.getdict("REDIS_PARAMS") if hasattr(settings, "getdict") else {}
    return get_redis(url_from_settings(settings), params)


@contextlib.contextmanager
def reachable(client: redis.Redis) -> Iterator[None]:
    """Turn "cannot connect", after the retries, into a clear error naming the server."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailable(f"cannot reach Redis at {describe(client)}: {exc}") from exc


def check(client: redis.Redis) -> None:
    """Ping Redis once; raise a clear error naming the server if it cannot be reached."""
    with reachable(client):
        client.ping()


def describe(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
