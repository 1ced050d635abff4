"""The dead-letter policy: what cannot be crawled is set aside, counted, and never silent.

Two kinds of things cannot be crawled:

- a request that cannot be **queued** (its meta or callback cannot be encoded,
  the codec's policy refuses it, or it is routed outside the spider's group):
  :meth:`DeadLetters.drop`. A record of it goes to the dead-letter list, its
  job counts it (``dropped`` and ``errors/dropped/<kind>``, so the job ends
  ``incomplete``), the stats count it (``scheduler/dropped/<kind>``), and the
  first of each kind is logged with what to change. Record and job stat go
  through the write-behind buffer (:mod:`celery_crawl.scheduler.buffer`), so they
  reach Redis in the same script call as the parent's ack, or before it: the
  job cannot end without them.
- a queue entry that cannot become a **request** when leased (undecodable, or
  refused by the codec's policy): :meth:`DeadLetters.dead_letter`. Record, job
  stat and the end of its lease are one script call (``queue/lua/dead_letter.lua``).
"""

from __future__ import annotations

import base64
import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery_crawl.core import connection
from celery_crawl.core.errors import DecodeError
from celery_crawl.jobs.signals import job_of

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from celery_crawl.core.entries import Lease
    from celery_crawl.queue.queues import Base
    from celery_crawl.scheduler.buffer import WriteBehind

logger = logging.getLogger(__name__)

# what to change, per kind of request that cannot be queued
NEXT_STEPS = {
    "unserializable": "change what the request carries so that the request codec can encode it"
    " (see the error: a meta or cb_kwargs value, a callback that is not a method of the"
    " spider, a request class)",
    "unroutable": "route requests only to spiders of the same group (CELERY_CRAWL_SPIDER_GROUPS)",
    "refused_scheme": "queue http and https URLs only, or widen SCHEDULER_ALLOWED_SCHEMES",
    "refused_method": "use the methods SCHEDULER_ALLOWED_METHODS lists, or widen it",
}


class DeadLetters:
    """One scheduler's dead letters: into ``buffer`` when queued, into ``queue`` when leased."""

    def __init__(self, queue: Base, buffer: WriteBehind, stats: StatsCollector | None) -> None:
        self.queue = queue
        self.buffer = buffer
        self.stats = stats
        self._logged: set[str] = set()  # kinds of drop logged already: once per kind

    def drop(self, request: Request, kind: str, error: Exception) -> bool:
        """A request that cannot be queued: dead-lettered and counted at the next flush.

        Returns False, for ``enqueue_request`` (the engine then sends
        ``request_dropped``).
        """
        job = job_of(request)
        self.buffer.dead_letter(self.record(kind, error, "enqueue", request=shown(request)))
        self.buffer.job_stats.add(job, "dropped")
        self.buffer.job_stats.add(job, f"errors/dropped/{kind}")
        self._inc(f"scheduler/dropped/{kind}")
        self._log_drop(kind, error)
        return False

    def dead_letter(self, lease: Lease, error: DecodeError) -> None:
        """Move an entry that cannot become a request out of the queue, with the reason.

        Redis refused or away: its lease expires, and the entry is met again then.
        """
        try:
            raw = lease.payload
        except (ValueError, IndexError):
            raw = lease.member[12:]
        entry = base64.b64encode(raw).decode("ascii")
        record = self.record(error.kind, error, "dequeue", entry=entry)
        try:
            self.queue.dead_letter(lease.member, record, error.kind)
        except connection.REFUSED_OR_TRANSIENT as exc:
            logger.warning("entry not dead-lettered yet (%s): %s", error, exc)
            return
        logger.warning("dead-lettered a queue entry (%s): %s", error.kind, error)
        self._inc(f"celery_crawl/dead_letter/{error.kind}")

    def record(self, kind: str, error: Exception, stage: str, **what: Any) -> str:
        """A dead-letter record: why, where, when, and what can be shown of the request."""
        record = {
            "reason": kind,
            "error": str(error),
            "stage": stage,
            "spider": self.queue.keys.spider,
            "at": datetime.now(UTC).isoformat(),
            **what,
        }
        return json.dumps(record)

    def _log_drop(self, kind: str, error: Exception) -> None:
        if kind in self._logged:
            logger.debug("dropped a request that cannot be queued (%s): %s", kind, error)
            return
        self._logged.add(kind)
        logger.error(
            "dropped a request that cannot be queued (%s): %s. To fix: %s. Each such request"
            " is kept in the dead-letter list %s and counted in its job (errors/dropped/%s)"
            " and in the stats (scheduler/dropped/%s); further drops of this kind are not logged",
            kind,
            error,
            NEXT_STEPS.get(kind, "see the error"),
            self.queue.keys.deadletter,
            kind,
            kind,
        )

    def _inc(self, key: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(key)


def drop_kind(error: Exception, default: str) -> str:
    """The short label of a drop, for stats keys and the dead-letter record."""
    return str(getattr(error, "kind", "") or default)


def shown(request: Request) -> dict[str, str | None]:
    """What a dead-letter record holds of a request that could not be queued: plain text only."""
    return {
        "url": request.url,
        "method": request.method,
        "callback": callback_name(request.callback),
        "errback": callback_name(request.errback),
        "job": job_of(request),
    }


def callback_name(func: Any) -> str | None:
    """What a dead-letter record can show of a callback: its name, never the object."""
    return None if func is None else str(getattr(func, "__name__", type(func).__name__))
