"""One crawl across processes: the open schedulers of a spider crawl together.

A **crawl** begins when a scheduler opens while no other is open on the
spider's queue, and ends when the last one closes. Its state is one hash,
``Q:crawl`` (:attr:`~celery_crawl.core.keys.SpiderKeys.crawl`):

- ``started``  when the crawl began, ms on the server's clock
  (``CLOSESPIDER_TIMEOUT`` counts from it);
- ``start``    the id of the scheduler that runs the spider's start requests,
  then ``done`` once it has queued them all;
- ``pages``, ``items``, ``errors``  the crawl-wide counts the ``CLOSESPIDER_*``
  limits are held to.

``scheduler/lua/crawl_open.lua`` registers a scheduler and begins the crawl, or takes part in it, in
one step (with ``SCHEDULER_PERSIST`` off, a new crawl starts with fresh
stats); ``scheduler/lua/crawl_start.lua`` tells where the start requests stand;
``queue/lua/scheduler_leave.lua`` deletes the hash with the last scheduler.

With ``SCHEDULER_START_REQUESTS = "once"`` (the default), only the first
scheduler whose spider's ``start()`` yields anything claims and runs the start
requests (:func:`start_once`); the others wait, open, until they are all
queued, then crawl the queue. If the claimant closes or is killed first, a
waiting process takes them over.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import redis

from celery_crawl.core import connection, scripts
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.core.repair import Repairer
from celery_crawl.core.scripts import Argv

logger = logging.getLogger(__name__)

START_MODES = ("once", "every")  # SCHEDULER_START_REQUESTS
START_POLL_SECONDS = 0.5  # a waiting process asks this often whether the start requests are in
COUNTS = ("pages", "items", "errors")  # the crawl-wide counts, fields of the crawl's hash
OPEN = Argv("crawl_open", ("scheduler_id", "milliseconds_registration_lasts", "fresh_stats"))
START = Argv("crawl_start", ("scheduler_id", "claim_or_done"))
_NOTHING: Any = object()  # start() yielded nothing


@dataclass(frozen=True)
class Opened:
    """What a scheduler learns when it opens: whom it crawls with, and what it runs."""

    others: int  # schedulers open before it: 0 means it began the crawl
    started_ms: int  # the crawl's start, on the server's clock
    now_ms: int  # the server's clock when it opened

    @property
    def elapsed(self) -> float:
        """Seconds since the crawl began, on the server's clock."""
        return max(0.0, (self.now_ms - self.started_ms) / 1000)


class Crawl:
    """The crawl a scheduler takes part in: its hash, read and written in single steps."""

    def __init__(self, client: redis.Redis, keys: SpiderKeys, scheduler_id: str) -> None:
        self.client = client
        self.keys = keys
        self.id = scheduler_id

    def open(self, seconds: float, *, fresh_stats: bool) -> Opened:
        """Register for ``seconds`` and take part in the crawl, or begin one
        (``scheduler/lua/crawl_open.lua``)."""
        keys = [self.keys.open_schedulers, self.keys.crawl, self.keys.stats, self.keys.stats_types]
        args = OPEN.build(
            scheduler_id=self.id,
            milliseconds_registration_lasts=max(1, int(seconds * 1000)),
            fresh_stats=int(fresh_stats),
        )
        others, started, now = scripts.script(self.client, OPEN.script)(keys=keys, args=args)
        return Opened(int(others), int(started), int(now))

    def start_state(self, done: bool = False) -> str:
        """Claim the start requests: ``mine``, ``running`` (in another scheduler) or ``done``.

        ``done=True``: this scheduler queued them all.
        """
        keys = [self.keys.open_schedulers, self.keys.crawl]
        args = START.build(scheduler_id=self.id, claim_or_done="done" if done else "claim")
        state = scripts.script(self.client, START.script)(keys=keys, args=args)
        return state.decode() if isinstance(state, bytes) else str(state)

    def count(self, field: str, amount: int = 1) -> int:
        """Add to a crawl-wide count; its new value."""
        return int(self.client.hincrby(self.keys.crawl, field, amount))

    def counts(self) -> dict[str, int]:
        """The crawl-wide counts, 0 where none was counted yet (or the value is damaged:
        the next count is refused, and the key repaired)."""
        values = self.client.hmget(self.keys.crawl, list(COUNTS))
        return {field: whole(value) for field, value in zip(COUNTS, values, strict=True)}


def whole(value: bytes | str | None) -> int:
    """A count read back; 0 for none, or for a value that is no integer."""
    text = (value.decode("latin-1") if isinstance(value, bytes) else value or "0").strip()
    return int(text) if text.lstrip("-").isdigit() else 0


async def start_once(
    start: AsyncIterator[Any], crawl: Crawl, queued: Callable[[], None]
) -> AsyncIterator[Any]:
    """The spider's start output, in the one process of the crawl that runs it.

    The first process whose ``start()`` yields anything claims the start
    requests; a process whose ``start()`` yields nothing (a consumer) claims
    nothing. The others wait here (so their engine stays open) until the start
    requests are all queued, then yield nothing; one takes them over if their
    claimant closed first. ``queued`` writes what this process buffered,
    before the others are told the start requests are in.
    """
    first = await anext(start, _NOTHING)
    if first is _NOTHING or not await _runs_here(crawl):
        return
    try:
        yield first
        async for output in start:
            yield output
    except GeneratorExit:  # dropped before its end (the process stops): another takes over
        raise
    except Exception:  # start() failed (Scrapy logs it): what it queued stands
        _end_start(crawl, queued)
        raise
    _end_start(crawl, queued)


async def _runs_here(crawl: Crawl) -> bool:
    """Claim the start requests; while another process runs them, wait. True: run them here.

    The wait is bounded by that process: it ends them, or it closes or is killed
    and its registration lapses (at most ``registration_seconds``), and this one
    takes over.
    """
    from scrapy.utils.asyncio import sleep

    state = _start_state(crawl)
    if state == "mine":
        logger.info("this process runs the start requests of the crawl")
        return True
    if state == "running":
        logger.warning(
            "this process's own start requests are not run: those of the crawl run in another"
            " process (SCHEDULER_START_REQUESTS = 'once'; 'every' runs each process's own);"
            " waiting until they are in"
        )
    while state == "running":
        await sleep(START_POLL_SECONDS)
        state = _start_state(crawl)
    if state == "mine":
        logger.warning("the process running the start requests closed first: this one runs them")
    return state == "mine"


def _start_state(crawl: Crawl) -> str:
    try:
        return crawl.start_state()
    except connection.TRANSIENT_ERRORS as exc:  # asked again after a pause
        connection.warn_away(logger, "Redis unreachable, start requests not checked: %s", exc)
    except redis.ResponseError as exc:  # a damaged crawl hash: repaired, asked again
        logger.warning("start requests not checked, Redis refused: %s", exc)
        Repairer(crawl.client, crawl.keys).after(exc)
    return "running"


def _end_start(crawl: Crawl, queued: Callable[[], None]) -> None:
    try:
        queued()
        crawl.start_state(done=True)
    except connection.REFUSED_OR_TRANSIENT as exc:  # the others take them over: at least once
        logger.warning("start requests not marked done: %s", exc)
