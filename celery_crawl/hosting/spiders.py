"""Spiders that read their start URLs from Redis, as scrapy-redis's do.

    from celery_crawl.spiders import RedisSpider  # was: from scrapy_redis.spiders import ...

The start key (the spider's ``redis_key``, else ``REDIS_START_URLS_KEY``,
``<prefix>:{name}:start_urls`` by default) is a list, a set
(``REDIS_START_URLS_AS_SET``) or a sorted set (``REDIS_START_URLS_AS_ZSET``)
of URLs or JSON objects (``{"url": ..., "meta": {...}, "method": ..., ...}``,
the contract of scrapy-redis's ``make_request_from_data``). ``start()`` pops
up to ``REDIS_START_URLS_BATCH_SIZE`` entries in one command (``LPOP``,
``SPOP`` or ``ZPOPMAX`` with a count: atomic, so two processes never take the
same entry), turns each into requests, and yields them into the shared
queue, where every process of the spider can lease them.

With the key empty it polls every ``redis_poll_seconds``. Once the crawler
has had no work and the key no entry for ``MAX_IDLE_TIME_BEFORE_CLOSE``
seconds, ``start()`` returns and the spider closes as any spider does; 0
(the default) keeps it open for ever.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import redis
from scrapy import Request, Spider
from scrapy.http import FormRequest
from scrapy.spiders import CrawlSpider

from celery_crawl.core import compat, connection, keys
from celery_crawl.core.defaults import setting
from celery_crawl.scheduler.engine import has_work

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

POP_COMMANDS = {"list": "lpop", "set": "spop", "zset": "zpopmax"}
SIZE_COMMANDS = {"list": "llen", "set": "scard", "zset": "zcard"}
STAT = "celery_crawl/start_urls/"


@dataclass(frozen=True)
class StartUrls:
    """The start key of a spider: a list, set or sorted set, popped a batch per command."""

    client: redis.Redis
    key: str
    kind: str = "list"

    @classmethod
    def from_settings(
        cls, spider: str, settings: BaseSettings, template: str | None = None
    ) -> StartUrls:
        kind = "list"
        if setting(settings, "REDIS_START_URLS_AS_SET"):
            kind = "set"
        elif setting(settings, "REDIS_START_URLS_AS_ZSET"):
            kind = "zset"
        key = keys.start_urls_key(spider, settings, template)
        return cls(connection.from_settings(settings), key, kind)

    def pop(self, count: int) -> list[bytes]:
        """Take up to ``count`` entries, in one command; ``[]`` when the key is empty."""
        popped = getattr(self.client, POP_COMMANDS[self.kind])(self.key, count)
        if self.kind == "zset":
            return [member for member, _score in popped]
        return list(popped or [])

    def __len__(self) -> int:
        return int(getattr(self.client, SIZE_COMMANDS[self.kind])(self.key))


class IdleClock:
    """Seconds without work; ``limit`` 0 never runs out."""

    def __init__(self, limit: float, clock: Any = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self.since = clock()

    def reset(self) -> None:
        self.since = self.clock()

    def expired(self) -> bool:
        return self.limit > 0 and self.clock() - self.since >= self.limit


class RedisMixin:
    """Start URLs from Redis; put it before a Spider class (``class S(RedisMixin, Spider)``).

    Attributes, each defaulting to its setting: ``redis_key``
    (``REDIS_START_URLS_KEY``), ``redis_batch_size``
    (``REDIS_START_URLS_BATCH_SIZE``), ``redis_encoding`` (``REDIS_ENCODING``),
    ``max_idle_time`` (``MAX_IDLE_TIME_BEFORE_CLOSE``).
    """

    name: str
    crawler: Crawler
    logger: Any  # Spider's

    # the scheduler's SCHEDULER_START_REQUESTS = "once" leaves this spider's start() to run
    # in every process: it pops the start key for as long as it runs (Scheduler.starts_once)
    start_in_every_process: ClassVar[bool] = True
    redis_key: str | None = None
    redis_batch_size: int | None = None
    redis_encoding: str | None = None
    max_idle_time: float | None = None
    redis_poll_seconds: ClassVar[float] = 1.0
    server: redis.Redis | None = None  # scrapy-redis's name for the client

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Any:
        spider = super().from_crawler(crawler, *args, **kwargs)  # type: ignore[misc]
        spider.setup_redis(crawler)
        return spider

    def setup_redis(self, crawler: Crawler | None = None) -> None:
        """Read the settings and connect; ``from_crawler`` calls it."""
        crawler = crawler or self.crawler
        settings = crawler.settings
        compat.check_settings(settings, type(self))
        self.start_urls_source = StartUrls.from_settings(self.name, settings, self.redis_key)
        self.server = self.start_urls_source.client
        batch = self.redis_batch_size or setting(settings, "REDIS_START_URLS_BATCH_SIZE")
        self.redis_batch_size = int(batch or settings.getint("CONCURRENT_REQUESTS"))
        self.redis_encoding = self.redis_encoding or setting(settings, "REDIS_ENCODING")
        if self.max_idle_time is None:
            self.max_idle_time = setting(settings, "MAX_IDLE_TIME_BEFORE_CLOSE")
        self.max_idle_time = float(self.max_idle_time or 0)
        self.logger.info(
            "Reading start URLs from Redis key %r (%s, batch size %d, closing after %s s idle)",
            self.start_urls_source.key,
            self.start_urls_source.kind,
            self.redis_batch_size,
            self.max_idle_time or "no",
        )

    async def start(self) -> AsyncIterator[Any]:
        """Feed start URLs into the queue until idle for ``max_idle_time`` seconds."""
        idle = IdleClock(float(self.max_idle_time or 0))
        while True:
            found = 0
            for request in self.next_requests():
                found += 1
                yield request
            if found or has_work(self.crawler):
                idle.reset()
            elif idle.expired():
                self.logger.info("idle for %s s with no start URLs: closing", self.max_idle_time)
                return
            if not found:
                await sleep(self.redis_poll_seconds)

    def next_requests(self) -> Iterator[Request]:
        """The requests made from one batch of the start key (scrapy-redis's name)."""
        for data in self._pop_batch():
            yield from self._requests_from(data)

    def _pop_batch(self) -> list[bytes]:
        try:
            return self.start_urls_source.pop(int(self.redis_batch_size or 1))
        except connection.TRANSIENT_ERRORS as exc:
            connection.warn_away(
                self.logger, "Redis unreachable, start URLs will be read later: %s", exc
            )
        except redis.ResponseError as exc:  # e.g. WRONGTYPE: a set read as a list
            self.logger.error(
                "cannot pop start URLs from %r (%s): check REDIS_START_URLS_AS_SET/_AS_ZSET",
                self.start_urls_source.key,
                exc,
            )
            self._inc("errors")
        return []

    def _requests_from(self, data: bytes) -> list[Request]:
        try:
            made = self.make_request_from_data(data)
            requests = [made] if isinstance(made, Request) else list(made or [])
        except Exception as exc:  # the spider's own make_request_from_data included
            self.logger.error("no request made from start data %r: %s", data[:200], exc)
            self._inc("invalid")
            return []
        self._inc("read")
        return [r for r in requests if isinstance(r, Request)]

    def make_request_from_data(self, data: bytes) -> Request | Iterable[Request]:
        """A URL, or a JSON object: ``url``, optional ``method`` and ``meta``, the rest form data.

        As in scrapy-redis: the request is a ``FormRequest`` with
        ``dont_filter=True`` (a URL pushed again is crawled again); an object
        without ``url`` makes no request. Override it for another format.
        """
        text = data.decode(self.redis_encoding or "utf-8") if isinstance(data, bytes) else data
        parameters = json_object(text)
        if parameters is None:
            return FormRequest(text.strip(), dont_filter=True)
        url = parameters.pop("url", None)
        if not isinstance(url, str):
            self.logger.warning("start data without a url: %r", text[:200])
            self._inc("no_url")
            return []
        method = str(parameters.pop("method", "GET")).upper()
        meta = parameters.pop("meta", None) or {}
        return FormRequest(url, dont_filter=True, method=method, formdata=parameters, meta=meta)

    def schedule_next_requests(self) -> None:
        """Crawl one batch of the start key now (scrapy-redis's name)."""
        for request in self.next_requests():
            self.crawler.engine.crawl(request)

    def _inc(self, name: str) -> None:
        self.crawler.stats.inc_value(STAT + name)


def json_object(text: str) -> dict[str, Any] | None:
    """The JSON object ``text`` holds; None for anything else (then ``text`` is a URL)."""
    if not text.lstrip().startswith("{"):
        return None
    value = json.loads(text)  # a malformed object is an error, not a URL
    if not isinstance(value, dict):
        raise ValueError("start data must be a URL or a JSON object")
    return value


async def sleep(seconds: float) -> None:
    """Wait on the reactor, whichever it is."""
    from scrapy.utils.defer import maybe_deferred_to_future
    from twisted.internet import reactor
    from twisted.internet.task import deferLater

    await maybe_deferred_to_future(deferLater(reactor, seconds))


class RedisSpider(RedisMixin, Spider):
    """``scrapy_redis.spiders.RedisSpider``: a Spider whose start URLs come from Redis."""


class RedisCrawlSpider(RedisMixin, CrawlSpider):
    """``scrapy_redis.spiders.RedisCrawlSpider``: a CrawlSpider whose start URLs come from Redis."""
