"""Items to a Redis list, as ``scrapy_redis.pipelines.RedisPipeline`` does, in batches.

    ITEM_PIPELINES = {"celery_crawl.pipelines.RedisPipeline": 400}

Each item is encoded (``REDIS_ITEMS_SERIALIZER``: Scrapy's JSON encoder by
default) and appended to ``REDIS_ITEMS_KEY`` (``<prefix>:{spider}:items``).
Items wait in the pipeline up to ``REDIS_ITEMS_FLUSH_DELAY`` seconds, or
until ``REDIS_ITEMS_BATCH_SIZE`` are waiting, and then reach Redis together:
one ``RPUSH`` per key, all in one pipelined round trip, run in a thread so
the reactor never blocks. An item counts as scraped only once it is in
Redis. When Redis is unreachable the batch is kept and written again
later, so no item is lost; any other error fails the batch's items, which
Scrapy logs and counts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, cast

import redis
from scrapy.utils.misc import load_object
from scrapy.utils.serialize import ScrapyJSONEncoder
from twisted.internet.defer import Deferred, succeed

from celery_crawl.core import compat, connection, keys
from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.errors import ConfigError, RedisUnavailable

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

Serializer = Callable[[Any], str | bytes]
RETRY_SECONDS = 1.0
to_json: Serializer = ScrapyJSONEncoder().encode
CLOSE_RETRIES = 60  # at close, a minute of retries before the items are given up, loudly


def serializer_from_name(name: str) -> Serializer:
    """``REDIS_ITEMS_SERIALIZER``: ``json``, or the import path of a function."""
    if name == "json":
        return to_json
    try:
        func = load_object(name)
    except (ImportError, NameError, ValueError) as exc:
        raise ConfigError(f"REDIS_ITEMS_SERIALIZER = {name!r} cannot be imported: {exc}") from exc
    if not callable(func):
        raise ConfigError(f"REDIS_ITEMS_SERIALIZER = {name!r} is not a function")
    return func  # type: ignore[no-any-return]


@dataclass
class Waiting:
    key: str
    data: str | bytes
    item: Any
    done: Deferred[Any]


class RedisPipeline:
    """``ITEM_PIPELINES = {"celery_crawl.pipelines.RedisPipeline": 400}``."""

    def __init__(
        self,
        client: redis.Redis,
        key: str = SETTINGS["REDIS_ITEMS_KEY"].default,
        serialize: Serializer = to_json,
        *,
        crawler: Crawler | None = None,
        batch_size: int = SETTINGS["REDIS_ITEMS_BATCH_SIZE"].default,
        flush_delay: float = SETTINGS["REDIS_ITEMS_FLUSH_DELAY"].default,
    ) -> None:
        self.client = client
        self.server = client  # scrapy-redis's name
        self.key = key
        self.serialize = serialize
        self.crawler = crawler
        self.batch_size = batch_size
        self.flush_delay = flush_delay
        self.waiting: list[Waiting] = []
        self.writing: list[Deferred[None]] = []
        self._timer: Any = None
        self._keys: dict[str, str] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        compat.check_settings(settings)
        return cls(
            connection.from_settings(settings),
            setting(settings, "REDIS_ITEMS_KEY"),
            serializer_from_name(setting(settings, "REDIS_ITEMS_SERIALIZER")),
            crawler=crawler,
            batch_size=setting(settings, "REDIS_ITEMS_BATCH_SIZE"),
            flush_delay=setting(settings, "REDIS_ITEMS_FLUSH_DELAY"),
        )

    def item_key(self, item: Any, spider: Spider) -> str:
        """The list of ``item``; override it to split items by kind (scrapy-redis's hook)."""
        if spider.name not in self._keys:
            if self.crawler is not None:
                settings: Any = self.crawler.settings
            else:
                settings = {"REDIS_ITEMS_KEY": self.key}
            self._keys[spider.name] = keys.items_key(spider.name, settings)
        return self._keys[spider.name]

    async def process_item(self, item: Any, spider: Spider | None = None) -> Any:
        """Wait until ``item`` is in Redis, then hand it on; several items share one write."""
        from scrapy.utils.defer import maybe_deferred_to_future

        if spider is None:
            spider = self.crawler.spider if self.crawler is not None else None
        if spider is None:
            raise ConfigError("RedisPipeline needs its crawler: build it with from_crawler")
        done: Deferred[Any] = Deferred()
        self.waiting.append(Waiting(self.item_key(item, spider), self.serialize(item), item, done))
        if len(self.waiting) >= self.batch_size:
            self.flush()
        elif self._timer is None:
            self._timer = call_later(self.flush_delay, self.flush)
        return await maybe_deferred_to_future(done)

    def flush(self) -> Deferred[None]:
        """Write the waiting items in one round trip, in a thread."""
        from twisted.internet import threads

        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        batch, self.waiting = self.waiting, []
        if not batch:
            return succeed(None)
        writing = threads.deferToThread(self.write, batch)
        writing.addCallback(self._written, batch)
        writing.addErrback(self._failed, batch)
        self.writing.append(writing)
        writing.addBoth(self._forget, writing)
        return writing

    def write(self, batch: list[Waiting]) -> None:
        """One ``RPUSH`` per key, pipelined: one round trip for the whole batch."""
        by_key: dict[str, list[str | bytes]] = {}
        for waiting in batch:
            by_key.setdefault(waiting.key, []).append(waiting.data)
        with self.client.pipeline(transaction=False) as pipe:
            for key, values in by_key.items():
                pipe.rpush(key, *values)
            pipe.execute()

    def _written(self, _: None, batch: list[Waiting]) -> None:
        for waiting in batch:
            waiting.done.callback(waiting.item)

    def _failed(self, failure: Any, batch: list[Waiting]) -> None:
        if failure.check(*connection.TRANSIENT_ERRORS):
            connection.warn_away(
                logger, "Redis unreachable, %d items will be written again", len(batch)
            )
            self.waiting[:0] = batch  # first in line, so the list keeps their order
            if self._timer is None:
                self._timer = call_later(RETRY_SECONDS, self.flush)
            return
        logger.error("items not written to Redis: %s", failure.getErrorMessage())
        for waiting in batch:
            waiting.done.errback(failure)

    def _forget(self, result: Any, writing: Deferred[None]) -> Any:
        self.writing.remove(writing)
        return result

    async def close_spider(self, spider: Spider | None = None) -> None:
        """Write what is left, and wait until every item is in Redis (or has failed)."""
        from scrapy.utils.defer import maybe_deferred_to_future
        from twisted.internet.defer import DeferredList

        from celery_crawl.hosting.spiders import sleep

        for _ in range(CLOSE_RETRIES):
            self.flush()
            await maybe_deferred_to_future(DeferredList(list(self.writing), consumeErrors=True))
            if not self.waiting and not self.writing:
                return
            await sleep(RETRY_SECONDS)  # put back by a transient error: try again
        lost, self.waiting = self.waiting, []
        logger.error("Redis stayed unreachable: %d items were not written", len(lost))
        for waiting in lost:
            waiting.done.errback(RedisUnavailable("Redis unreachable at close"))


def call_later(delay: float, func: Callable[[], Any]) -> Any:
    from twisted.internet import reactor

    return cast(Any, reactor).callLater(delay, func)
