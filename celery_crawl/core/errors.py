"""Every exception celery_crawl raises on purpose, so callers can catch them by kind.

All derive from :class:`CeleryCrawlError`::

    CeleryCrawlError
    ├── ConfigError       a setting is missing, malformed or unsupported
    ├── RedisUnavailable  Redis cannot be reached, even after retries
    ├── EncodeError       a request cannot become a queue entry
    ├── DecodeError       a queue entry cannot become a request
    ├── UnknownSpider     ``crawl()`` named a spider the project does not have
    ├── BadInput          an argument of a job breaks the rules of celery_crawl.jobs.inputs
    │   └── BadSeed       a seed the spider cannot turn into requests
    ├── UnknownJob        no job with this id exists
    ├── JobTimeout        ``Job.wait`` ran out of time (the job goes on)
    │   └── RedisOutOfMemory  ... while Redis refused writes for memory
    ├── JobFailed         the job fetched no page and counted errors
    ├── JobIncomplete     the job ended, but some of its requests could not be queued
    ├── ScriptError       a Lua script cannot be assembled from its files
    └── CookieError       a cookie read back from a shared jar is malformed
"""

from __future__ import annotations

from typing import Any

QUOTED_CHARS = 200  # the most of an input any message quotes


def quote(value: Any, limit: int = QUOTED_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters: messages quote input, never all of it."""
    return cut(repr(value), limit)


def cut(text: str, limit: int = QUOTED_CHARS) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


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


class UnknownSpider(CeleryCrawlError):
    """``crawl()`` named a spider the project does not have."""


class BadInput(CeleryCrawlError, ValueError):
    """An argument of a job (id, seeds, priority, limits, spider arguments) is refused.

    Raised by :mod:`celery_crawl.jobs.inputs` before anything is written to Redis.
    """


class BadSeed(BadInput):
    """A seed the spider cannot turn into requests."""


class UnknownJob(CeleryCrawlError):
    """No job with this id exists (never started, expired, or its hash damaged)."""


class JobTimeout(CeleryCrawlError):
    """``Job.wait`` ran out of time; the job goes on."""


class RedisOutOfMemory(JobTimeout):
    """``Job.wait`` ran out of time while Redis was out of memory (at its ``maxmemory``).

    The job goes on once Redis has room again: workers keep the requests they hold.
    """


class JobFailed(CeleryCrawlError):
    """The job ended without fetching a single page, and with errors (the job task raises it)."""


class JobIncomplete(CeleryCrawlError):
    """The job ended, but requests of it were dropped: they could not be queued.

    The job task raises it, so that the job is not reported as a clean success;
    ``Job.wait`` returns the statistics with ``"state": "incomplete"``.
    """


class ScriptError(CeleryCrawlError):
    """A Lua script cannot be assembled: unknown script or fragment, or a slot left unfilled."""


class CookieError(CeleryCrawlError):
    """A cookie read back from a shared cookie jar is malformed (it is skipped and counted)."""
