"""Crawl stats shared by every process, in one Redis hash per spider.

Layout: ``STATS_KEY`` is a hash of field -> value; ``STATS_KEY:types`` maps
each field to a type tag, so ``get_value`` gives back an ``int``, ``float``,
``bool``, ``datetime``, ``str`` or JSON value, as it was set.

Changes are buffered in the process and written by one Lua script call
(``stats/lua/stats_update.lua``) every ``STATS_FLUSH_INTERVAL`` seconds, when the
buffer grows past ``STATS_FLUSH_MAX_OPS``, before any read, and at close.

The hash holds the crawl's stats: every process's changes, added up. With
``SCHEDULER_PERSIST`` off, a new crawl (:mod:`celery_crawl.scheduler.crawl_state`) starts
it afresh. A collector also keeps its own process's values (:attr:`own`), and
its closing dump shows both, each under its own heading.

Each call carries the collector's number for it. A call that Redis ran but
whose reply was lost (Redis stopped, a connection cut) is sent again by the
client, and by the collector when the client gave up: its number makes the
second run change nothing, so an increment is added once. A call that failed
is kept and sent again, unchanged, before anything buffered since.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import redis
from scrapy.statscollectors import StatsCollector, StatsT

from celery_crawl.core import compat, connection, scripts
from celery_crawl.core.defaults import setting
from celery_crawl.core.keys import WRITTEN_KEPT_MS, SpiderKeys
from celery_crawl.core.repair import Repairer
from celery_crawl.core.scripts import Argv

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

Op = tuple[str, str, str, str]  # op, field, encoded value, type tag


_ENCODERS: tuple[tuple[type, str, Callable[[Any], str]], ...] = (
    (bool, "b", lambda value: "1" if value else "0"),  # before int: bool is an int
    (int, "i", str),
    (float, "f", repr),
    (datetime, "d", lambda value: value.isoformat()),
    (str, "s", str),
)


def encode(value: Any) -> tuple[str, str]:
    """A stats value as (text, type tag)."""
    for kind, tag, to_text in _ENCODERS:
        if isinstance(value, kind):
            return to_text(value), tag
    try:
        return json.dumps(value), "j"
    except (TypeError, ValueError):
        return str(value), "s"


_DECODERS: dict[str, Callable[[str], Any]] = {
    "i": int,
    "f": float,
    "b": lambda text: text == "1",
    "d": datetime.fromisoformat,
    "s": str,
    "j": json.loads,
}


def decode(text: bytes | str, tag: bytes | str | None) -> Any:
    """A value read back from the hash; untyped numbers stay numbers.

    A value tagged as a number that holds none (damaged) is None: Scrapy's
    extensions then see their default, not text they would subtract from.
    """
    text = text.decode() if isinstance(text, bytes) else text
    tag = tag.decode() if isinstance(tag, bytes) else tag
    decoder = _DECODERS.get(tag or "")
    if decoder is not None:
        try:
            return decoder(text)
        except ValueError:  # damaged: a number that is not one reads as missing
            return None if tag in ("i", "f") else text
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


RATES = ("response_received_count", "item_scraped_count")  # also counted per minute
UPDATE = Argv(
    "stats_update",
    ("writer_number", "milliseconds_record_kept"),
    tail=("op", "field", "value", "type_tag"),
)


class RedisStatsCollector(StatsCollector):
    """``STATS_CLASS = "celery_crawl.stats.RedisStatsCollector"``."""

    # Scrapy's StatsCollector.__getattribute__ wraps the stats methods to warn about a
    # ``spider`` argument; it runs on every attribute read, and costs the crawl a few percent
    # (docs/benchmarks.md). These methods take and ignore ``spider``: plain lookup is enough.
    __getattribute__ = object.__getattribute__

    def __init__(self, crawler: Crawler, client: redis.Redis | None = None) -> None:
        super().__init__(crawler)
        compat.check_settings(crawler.settings)
        self.client = client or connection.from_settings(crawler.settings)
        self.keys = SpiderKeys.from_settings(crawler.spidercls.name, crawler.settings)
        self.repairer = Repairer(self.client, self.keys)
        self.flush_interval: float = setting(crawler.settings, "STATS_FLUSH_INTERVAL")
        self.max_ops: int = setting(crawler.settings, "STATS_FLUSH_MAX_OPS")
        self._ops: list[Op] = []
        self._increments: dict[str, int | float] = {}
        self._loop: Any = None
        self.writer = (
            uuid.uuid4().hex
        )  # numbers this collector's calls (stats/lua/stats_update.lua)
        self._calls = 0
        self.unconfirmed: tuple[int, list[str]] | None = None  # failed: sent again first
        self.own: StatsT = {}  # this process's own values, as Scrapy's MemoryStatsCollector

    def _queue(self, op: str, key: str, value: Any) -> None:
        if key in self._increments:  # keep the order: an earlier increment first
            self._ops.append(self._increment_op(key, self._increments.pop(key)))
        text, tag = encode(value)
        self._ops.append((op, key, text, tag))
        if len(self._ops) + len(self._increments) >= self.max_ops:
            self.flush()

    def inc_value(self, key: str, count: int = 1, start: int = 0, spider: Any = None) -> None:
        if start:
            self._queue("setnx", key, start)
        self.own[key] = self.own.get(key, start) + count
        self._increments[key] = self._increments.get(key, 0) + count
        if len(self._increments) + len(self._ops) >= self.max_ops:
            self.flush()

    def set_value(self, key: str, value: Any, spider: Any = None) -> None:
        self.own[key] = value
        self._queue("set", key, value)

    def max_value(self, key: str, value: Any, spider: Any = None) -> None:
        self.own[key] = max(self.own.setdefault(key, value), value)
        self._queue("max", key, value)

    def min_value(self, key: str, value: Any, spider: Any = None) -> None:
        self.own[key] = min(self.own.setdefault(key, value), value)
        self._queue("min", key, value)

    def set_stats(self, stats: StatsT, spider: Any = None) -> None:
        self.clear_stats()
        for key, value in stats.items():
            self.set_value(key, value)

    def clear_stats(self, spider: Any = None) -> None:
        self.own.clear()
        self._increments.clear()
        self._ops = [("clear", "", "", "")]

    def get_value(self, key: str, default: Any = None, spider: Any = None) -> Any:
        self.flush()
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hget(self.keys.stats, key)
            pipe.hget(self.keys.stats_types, key)
            text, tag = pipe.execute()
        value = None if text is None else decode(text, tag)
        return default if value is None else value

    def get_stats(self, spider: Any = None) -> StatsT:
        self.flush()
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.stats)
            pipe.hgetall(self.keys.stats_types)
            values, types = pipe.execute()
        return {k.decode(): decode(v, types.get(k)) for k, v in values.items()}

    def flush(self) -> None:
        """Write the buffered changes in one round trip; keep them if Redis is away.

        A call that failed before goes first, as it was; the changes buffered
        since wait for the next flush if it fails again.
        """
        if self.unconfirmed is not None and not self._send(*self.unconfirmed):
            return
        args = self._take()
        if args:
            self._calls += 1
            self._send(self._calls, args)

    def _take(self) -> list[str]:
        """The buffered changes as the script's arguments; the buffer starts empty again."""
        ops = self._ops + [self._increment_op(k, v) for k, v in self._increments.items()]
        ops += [("rate", k, str(int(v)), "i") for k, v in self._increments.items() if k in RATES]
        self._ops, self._increments = [], {}
        op, field, value, tag = zip(*ops, strict=True) if ops else ((), (), (), ())
        return UPDATE.rest(op=op, field=field, value=value, type_tag=tag)

    def _send(self, number: int, args: list[str]) -> bool:
        """One numbered call; False if Redis did not take it (kept, sent again first)."""
        keys = [self.keys.stats, self.keys.stats_types, self.keys.stats_written(self.writer)]
        try:
            head = UPDATE.build(writer_number=number, milliseconds_record_kept=WRITTEN_KEPT_MS)
            scripts.script(self.client, UPDATE.script)(keys=keys, args=head + args)
        except connection.REFUSED_OR_TRANSIENT as exc:
            self.unconfirmed = (number, args)
            if isinstance(exc, connection.TRANSIENT_ERRORS):
                connection.warn_away(logger, "stats not flushed, will retry: %s", exc)
            else:  # a damaged key: kept, repaired, tried again
                self.repairer.after(exc)
            return False
        self.unconfirmed = None
        return True

    @staticmethod
    def _increment_op(key: str, count: int | float) -> Op:
        text, tag = encode(count)
        return ("incr", key, text, tag)

    def open_spider(self, spider: Any = None) -> None:
        from twisted.internet import task

        self._loop = task.LoopingCall(self.flush)
        self._loop.start(self.flush_interval, now=False)

    def close_spider(self, spider: Any = None, reason: str | None = None) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self.flush()
        if self._dump:
            self._dump_stats()

    def _dump_stats(self) -> None:
        """This process's own values, then the crawl's (every process's, from Redis)."""
        import pprint

        spider = {"spider": self._crawler.spider}
        logger.info(
            "Dumping Scrapy stats, this process only:\n%s", pprint.pformat(self.own), extra=spider
        )
        if not logger.isEnabledFor(logging.INFO):
            return
        try:  # read before the log call: a logging call that raises is not reported as such
            crawl = self.get_stats()
        except connection.REFUSED_OR_TRANSIENT as exc:  # unreachable, or a damaged hash
            logger.warning(
                "the whole crawl's stats (Redis hash %s) are not shown: %s",
                self.keys.stats,
                exc,
                extra=spider,
            )
            return
        logger.info(
            "Dumping Scrapy stats, the whole crawl (every process, Redis hash %s):\n%s",
            self.keys.stats,
            pprint.pformat(crawl),
            extra=spider,
        )
