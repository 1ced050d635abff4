"""The exceptions celery_crawl raises, so callers can catch them by kind."""

from __future__ import annotations


class CeleryCrawlError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(CeleryCrawlError):
    """A setting is missing, malformed or names something unsupported."""


class RedisUnavailable(CeleryCrawlError):
    """Redis cannot be reached, even after the transient-error retries."""


class EncodeError(CeleryCrawlError):
    """A request cannot be turned into a queue entry (e.g. unserializable meta)."""


class DecodeError(CeleryCrawlError):
    """A queue entry read back from Redis cannot be turned into a request.

    ``kind`` is a short, stable label used in stats keys and the dead-letter list.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ScriptError(CeleryCrawlError):
    """A Lua script cannot be assembled: unknown script or fragment, or a slot left unfilled."""
