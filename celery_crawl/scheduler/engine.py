"""Everything celery_crawl does with Scrapy's private engine API, in one place.

The scheduler needs things Scrapy's public API does not give:

- to know when the engine is **done** with a request (its response went
  through the callback and every request the callback yielded reached the
  scheduler, or the request failed for good), so that its lease is acked
  only then. The engine's slot calls ``remove_request(request)`` at exactly
  that moment; :meth:`EngineHooks.ack_when_done` wraps it: the one place the
  scheduler's ``ack`` is called from, and the only change made to the engine;
- to know whether the engine has **work** besides its start requests
  (:func:`has_work`), which ``Spider.start()`` of a
  :class:`~celery_crawl.spiders.RedisSpider` needs to measure idle time while
  it keeps polling for start URLs (``engine.spider_is_idle()`` is false as
  long as ``start()`` runs);
- to run the spider's **start** output in one process of a crawl only, the
  others waiting on it (:meth:`EngineHooks.wrap_start`, ``engine._start``);
- to **wake** the engine's scheduling loop as soon as another process
  pushes work, instead of at its next 5-second heartbeat:
  ``slot.nextcall.schedule(delay)``;
- to **close the spider** when a crawl-wide limit is reached, as Scrapy's
  ``CloseSpider`` extension does (:meth:`EngineHooks.close_spider`);
- to reach the item **pipelines**, whose ``open_job`` and ``close_job`` hooks
  run as a process joins and leaves a job (``engine.scraper.itemproc``).

Checked against Scrapy 2.19 (``ExecutionEngine._slot``, ``_start``, a ``_Slot`` with
``remove_request``, ``nextcall`` and ``scheduler``; ``engine.downloader.active``,
``engine.scraper.slot.is_idle()``). If an upgrade removes them, opening
the scheduler fails with a :class:`~celery_crawl.core.errors.ConfigError`
instead of silently never acking. The only other private Scrapy names
celery_crawl uses are ``FeedExporter``'s slot methods, in
:mod:`celery_crawl.hosting.feeds`, checked the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_crawl.core.errors import ConfigError

CHECKED_SCRAPY = "2.19"


class EngineHooks:
    """The hooks into one crawler's engine; inert when there is no engine (tests, benchmarks)."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler

    @property
    def engine(self) -> Any:
        """The running engine; None when the scheduler is driven by hand."""
        try:
            return self.crawler.engine if self.crawler is not None else None
        except RuntimeError:  # Crawler.engine before the crawl started
            return None

    def ack_when_done(self, ack: Callable[[Any], None]) -> None:
        """Call ``ack(request)`` each time the engine is done with a request.

        The engine's slot is patched here, and nowhere else: its
        ``remove_request`` runs, then ``ack``.
        """
        slot = getattr(self.engine, "_slot", None)
        if slot is None or not hasattr(slot, "remove_request"):
            raise ConfigError(
                "this Scrapy version's engine has no slot to watch for acks "
                f"(celery_crawl was checked against Scrapy {CHECKED_SCRAPY})"
            )
        remove_request = slot.remove_request

        def remove_then_ack(request: Any) -> None:
            remove_request(request)
            ack(request)

        slot.remove_request = remove_then_ack

    def wrap_start(self, wrapper: Callable[[Any], Any]) -> None:
        """Put ``wrapper(start)`` in place of the spider's start output the engine reads.

        The engine takes ``start()`` from the spider middlewares just before it
        opens the scheduler, and reads it afterwards; a spider whose start
        output is already read (or none) is left alone.
        """
        engine = self.engine
        if engine is None:
            return
        if not hasattr(engine, "_start"):
            raise ConfigError(
                "this Scrapy version's engine has no start output to share out "
                f"(celery_crawl was checked against Scrapy {CHECKED_SCRAPY}); set "
                'SCHEDULER_START_REQUESTS = "every"'
            )
        if engine._start is not None:
            engine._start = wrapper(engine._start)

    def close_spider(self, reason: str) -> None:
        """Close the spider with ``reason``, as Scrapy's ``CloseSpider`` extension does."""
        from scrapy.utils.defer import deferred_from_coro

        engine = self.engine
        if engine is not None and engine.spider is not None:
            deferred_from_coro(engine.close_spider_async(reason=reason))

    def pipelines(self) -> list[Any]:
        """The item pipelines of the running engine (none without an engine)."""
        itemproc = getattr(getattr(self.engine, "scraper", None), "itemproc", None)
        return list(getattr(itemproc, "middlewares", ()))

    def wake(self, delay: float = 0.0) -> None:
        """Ask the engine for its next request ``delay`` seconds from now (no-op when closed)."""
        slot = getattr(self.engine, "_slot", None)
        if slot is not None:
            slot.nextcall.schedule(delay)


def has_work(crawler: Any) -> bool:
    """Whether the engine downloads, scrapes or has scheduled requests (start requests aside)."""
    engine = EngineHooks(crawler).engine
    slot = getattr(engine, "_slot", None)
    if slot is None:
        return False
    scraper_slot = engine.scraper.slot
    if scraper_slot is not None and not scraper_slot.is_idle():
        return True
    return bool(engine.downloader.active) or bool(slot.scheduler.has_pending_requests())
