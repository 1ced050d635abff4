"""The backpressure-aware producer: one crawl job per source, every beat period.

Each tick reserves sources atomically (``producer/lua/produce.lua``):

- jobs produced and not finished stay under ``PRODUCER_JOB_CAP``; the
  producer adds only the difference;
- nothing is produced while the queues of the spider's group (its own and those
  of the spiders its requests are routed to, ``CELERY_CRAWL_SPIDER_GROUPS``)
  hold ``PRODUCER_QUEUE_CAP`` requests or more together, so queues whose
  consumers fell behind stay at the cap;
- a source whose previous job is still queued or running is skipped;
- a cursor in Redis makes successive ticks go round-robin through the
  sources, so with more sources than the cap, every one is still produced
  within ceil(sources / cap) ticks.

The sources are the spider's ``PRODUCER_SOURCES`` setting, or the Redis set
``SpiderKeys.sources`` when it exists, which application code may change at
run time. Decisions are counted in the stats hash (``producer/produced``,
``producer/held_back``, ``producer/skipped_running``) and logged.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from celery_crawl.core import scripts
from celery_crawl.core.defaults import SETTINGS
from celery_crawl.core.errors import ConfigError, quote
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.core.repair import Repairer, retried
from celery_crawl.core.scripts import Argv
from celery_crawl.producer.schedule import schedule_keys

logger = logging.getLogger(__name__)

START_GRACE = 120  # seconds a reservation may wait for its job to be created


def lua_constants() -> str:
    """The constants ``producer/lua/produce.lua`` and ``schedule_tick.lua`` share with Python."""
    return scripts.lua_constants(START_GRACE=START_GRACE)


PRODUCE = Argv("produce", ("job_cap", "queue_cap", "sources"), (("sources",), ("job_ids",)))


@dataclass(frozen=True)
class Tick:
    """What one producer tick decided."""

    produced: list[tuple[str, str]]  # (source, job id)
    sources: int
    queued: int


class Producer:
    """Produces jobs of ``keys``' spider; ``group`` is every spider of its group (default: it)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: SpiderKeys,
        job_cap: int = SETTINGS["PRODUCER_JOB_CAP"].default,
        queue_cap: int = SETTINGS["PRODUCER_QUEUE_CAP"].default,
        group: Sequence[SpiderKeys] = (),
    ) -> None:
        self.client = client
        self.keys = keys
        self.job_cap = job_cap
        self.queue_cap = queue_cap
        self.group = list(group) or [keys]
        self.repairer = Repairer(client, keys, self.group)  # a refused key: its spider's

    def sources(self, configured: Sequence[str]) -> list[str]:
        """The Redis set when it exists, else the configured list; in a stable order."""
        try:
            members: set[bytes] = self.client.smembers(self.keys.sources)  # type: ignore[assignment]
        except redis.ResponseError as exc:  # written by application code: never moved aside
            raise ConfigError(
                f"the producer's sources {self.keys.sources} must be a set of source ids: {exc}"
            ) from exc
        return sorted(self._texts(members)) if members else list(configured)

    def _texts(self, members: set[bytes]) -> list[str]:
        """The members that are UTF-8 text; each other one is logged and left out."""
        texts = []
        for member in members:
            try:
                texts.append(member.decode())
            except UnicodeDecodeError:
                key = self.keys.sources
                logger.error("producer: a source in %s is not UTF-8: %s", key, quote(member))
        return texts

    def reserve(self, sources: Sequence[str]) -> Tick:
        """Reserve the sources to produce now, atomically, with fresh job ids.

        The queue length the cap is checked against is read in the same script.
        """
        job_ids = [uuid.uuid4().hex for _ in sources]
        keys = [
            *schedule_keys(self.keys),
            self.keys.producer_cursor,
            self.keys.stats,
            self.keys.job_prefix,
            *(member.queue for member in self.group),
        ]
        args = PRODUCE.build(job_cap=self.job_cap, queue_cap=self.queue_cap, sources=len(sources))
        args += PRODUCE.each(0, sources=sources) + PRODUCE.each(1, job_ids=job_ids)
        queued, *flat = scripts.script(self.client, PRODUCE.script)(keys=keys, args=args)
        pairs = [(flat[i].decode(), flat[i + 1].decode()) for i in range(0, len(flat), 2)]
        return Tick(pairs, len(sources), int(queued))

    def release(self, source: str) -> None:
        """Give a reservation back when its job could not be started."""
        self.client.hdel(self.keys.producer_running, source)

    def tick(self, sources: Sequence[str], start: Callable[[str, str], Any]) -> Tick:
        """Reserve, then start a job per reservation with ``start(source, job_id)``.

        A key of the wrong type, of any spider of the group, is refused before the
        script writes, moved aside with the spider it is of (:mod:`celery_crawl.core.repair`),
        and the tick sent once more.
        """
        tick = retried(self.repairer, lambda: self.reserve(sources))
        for source, job_id in tick.produced:
            try:
                start(source, job_id)
            except Exception:
                logger.exception("producer: job for %s not started; released", quote(source))
                self.release(source)
        logger.info(
            "producer %s: produced %d of %d sources (queue %d, cap %d jobs / %d requests)",
            self.keys.spider,
            len(tick.produced),
            tick.sources,
            tick.queued,
            self.job_cap,
            self.queue_cap,
        )
        return tick
