"""Scrapy crawlers hosted inside a worker process, on a reactor run by crochet.

Each worker process (each prefork child, or the one process of the solo and
threads pools) installs Scrapy's asyncio reactor, then lets crochet run it in
a thread. The reactor is never stopped, so there is no ReactorNotRestartable.

:class:`CrawlerHost` keeps one crawler per spider open for the life of the
process. Each crawler's engine consumes the shared queue whenever it has
work, whichever job the work belongs to; job tasks only seed and watch. So
the number of jobs in progress is not capped by the number of pool slots.

Once the crawlers are open, the process's startup heap (modules, the Celery
app, the crawlers and their components) is frozen out of the cyclic garbage
collector's reach (:func:`freeze_startup_heap`). Those objects live as long
as the process, and without the freeze every full collection during a crawl
walks them all again.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Sequence
from typing import Any

from scrapy.settings import Settings

from celery_crawl.defaults import setting

logger = logging.getLogger(__name__)

ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
_setup_lock = threading.Lock()
_reactor: dict[str, bool] = {"running": False}


def setup_reactor() -> None:
    """Install the asyncio reactor and start it in a crochet thread; once per process."""
    with _setup_lock:
        if _reactor["running"]:
            return
        from scrapy.utils.reactor import install_reactor, is_reactor_installed

        if not is_reactor_installed():
            install_reactor(ASYNCIO_REACTOR)
        import crochet

        crochet.setup()
        _reactor["running"] = True


class CrawlerHost:
    """One long-lived crawler per spider, sharing this process's reactor."""

    def __init__(self, settings: Settings, spiders: Sequence[str]) -> None:
        self.settings = settings
        self.spiders = list(spiders)
        self.runner: Any = None

    def start(self, timeout: float = 60.0) -> None:
        """Open every spider; returns once their engines run."""
        import crochet

        setup_reactor()
        crochet.run_in_reactor(self._start)().wait(timeout)
        logger.info("hosting crawlers for %s", ", ".join(self.spiders))
        if setting(self.settings, "CELERY_CRAWL_GC_FREEZE"):
            logger.info("%d startup objects frozen out of the GC", freeze_startup_heap())

    def _start(self) -> Any:
        from scrapy.crawler import CrawlerRunner
        from twisted.internet.defer import DeferredList

        self.runner = CrawlerRunner(self.settings)
        return DeferredList([self._open(name) for name in self.spiders], fireOnOneErrback=True)

    def _open(self, name: str) -> Any:
        from scrapy import signals
        from twisted.internet.defer import Deferred

        crawler = self.runner.create_crawler(name)
        opened: Deferred[None] = Deferred()
        crawler.signals.connect(keep_alive, signal=signals.spider_idle, weak=False)
        crawler.signals.connect(
            lambda spider: opened.callback(None), signal=signals.spider_opened, weak=False
        )
        finished = self.runner.crawl(crawler)
        finished.addBoth(self._stopped, name, opened)
        return opened

    @staticmethod
    def _stopped(result: Any, name: str, opened: Any) -> Any:
        logger.info("crawler %s stopped", name)
        if not opened.called:  # it failed to open: let start() raise
            opened.errback(result)
            return None
        return result

    def stop(self, timeout: float = 60.0) -> None:
        """Close every crawler: in-flight requests finish, leases held are handed back."""
        import crochet

        if self.runner is None:
            return
        try:
            crochet.run_in_reactor(self.runner.stop)().wait(timeout)
        except crochet.TimeoutError:
            logger.warning("crawlers did not stop within %s s", timeout)


def freeze_startup_heap() -> int:
    """Move every object alive now to the GC's permanent generation; how many there are.

    Startup garbage is collected first: a frozen object is never freed. Objects
    made later (requests, responses, items) are collected as usual.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def keep_alive(spider: Any) -> None:
    """A hosted spider waits for more work instead of closing when idle."""
    from scrapy.exceptions import DontCloseSpider

    raise DontCloseSpider
