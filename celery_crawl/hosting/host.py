"""Scrapy crawlers hosted inside a worker process, on a reactor run by crochet.

Each worker process (each prefork child, or the one process of the solo and
threads pools) installs Scrapy's asyncio reactor, then lets crochet run it in
a thread. The reactor is never stopped, so there is no ReactorNotRestartable.

:class:`CrawlerHost` keeps one crawler per spider open for the life of the
process. Each crawler's engine consumes the shared queue whenever it has
work, whichever job the work belongs to; job tasks only seed and watch. So
the number of jobs in progress is not capped by the number of pool slots.

A crawler that closes while the process runs (``CloseSpider`` from an
extension, an error) is opened again; one that cannot be opened again makes
the process exit non-zero, so that its supervisor replaces it. Jobs end on
their own: ``CloseSpider`` in a job's callback and the ``CLOSESPIDER_*``
limits close that job, not the crawler (:mod:`celery_crawl.jobs.limits`).

Once the crawlers are open, the process's startup heap (modules, the Celery
app, the crawlers and their components) is frozen out of the cyclic garbage
collector's reach (:func:`freeze_startup_heap`). Those objects live as long
as the process, and without the freeze every full collection during a crawl
walks them all again. The collector's thresholds are then raised
(``CELERY_CRAWL_GC_THRESHOLD``): a crawl makes many short-lived containers,
and Python's default first threshold (700) collects, and promotes, them
several thousand times in a few seconds of crawling.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any, cast

from scrapy.settings import SETTINGS_PRIORITIES, Settings

from celery_crawl.core import connection
from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.heartbeat import Heartbeat
from celery_crawl.core.keys import SpiderKeys, workers_key
from celery_crawl.core.repair import Repairer
from celery_crawl.hosting.registry import WorkerRegistration
from celery_crawl.jobs.logcontext import detached

logger = logging.getLogger(__name__)

ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
REOPEN_DELAY = 1.0  # seconds before a crawler that closed while hosted is opened again
EXIT_UNHOSTED = 70  # EX_SOFTWARE: a crawler could not be opened again
STARTING_POLL = 0.05  # seconds between looks at an engine that is still starting, at a stop
REAP_SECONDS = 1.0  # between looks for ended children of Twisted's spawnProcess (crochet: 0.1)
_setup_lock = threading.Lock()


def _new_setup_lock() -> None:
    """In a forked child: a thread of the parent (a job tracker) may have held it at the fork,
    and the child inherits it held, with no thread to release it."""
    global _setup_lock  # noqa: PLW0603 - rebound in a forked child only
    _setup_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_setup_lock)
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
        from twisted.internet import reactor

        reactor.callFromThread(_reap_less_often)


def _reap_less_often() -> None:
    """In the reactor, once: crochet reaps the children of Twisted's ``spawnProcess``
    every 0.1 s, since the reactor runs without signal handlers (Celery owns them). A
    hosting process starts none that way (Scrapy does not, and scrapy-playwright's browsers
    are asyncio's children), so every :data:`REAP_SECONDS` is enough, and an idle
    process's reactor wakes up to nine times a second less."""
    from twisted.internet import reactor, task
    from twisted.internet.process import reapAllProcesses

    for call in cast(Any, reactor).getDelayedCalls():
        if isinstance(call.func, task.LoopingCall) and call.func.f is reapAllProcesses:
            call.func.interval = REAP_SECONDS


def configure_reactor(runner: Any) -> None:
    """In the reactor: what ``CrawlerProcess`` does to it and ``CrawlerRunner`` does not.

    Scrapy's ``CrawlerProcessBase._setup_reactor`` installs the DNS resolver
    that ``TWISTED_DNS_RESOLVER`` names (by default Scrapy's caching one, with
    ``DNSCACHE_ENABLED``, ``DNSCACHE_SIZE`` and ``DNS_TIMEOUT``) and sizes the
    reactor's thread pool (``REACTOR_THREADPOOL_MAXSIZE``), which name lookups
    use. Its signal handlers are not installed: Celery owns the process's
    signals. Built from the project's settings, once per process, as
    ``CrawlerProcess`` builds them from its own.
    """
    from scrapy.utils.misc import build_from_crawler, load_object
    from twisted.internet import reactor

    settings = runner.settings
    resolver_class = load_object(resolver_path(settings))
    resolver = build_from_crawler(resolver_class, runner, reactor=reactor)
    resolver.install_on_reactor()
    reactor.getThreadPool().adjustPoolsize(maxthreads=settings.getint("REACTOR_THREADPOOL_MAXSIZE"))
    logger.info(
        "reactor: %s resolver, thread pool of %d at most",
        resolver_class.__name__,
        reactor.getThreadPool().max,
    )


def resolver_path(settings: Settings) -> str:
    """``TWISTED_DNS_RESOLVER``, or the deprecated ``DNS_RESOLVER`` when set above it."""
    old = settings.getpriority("DNS_RESOLVER") or 0
    new = settings.getpriority("TWISTED_DNS_RESOLVER") or 0
    if old > SETTINGS_PRIORITIES["default"] and old >= new:
        return str(settings["DNS_RESOLVER"])
    return str(settings["TWISTED_DNS_RESOLVER"])


class CrawlerHost:
    """One long-lived crawler per spider, sharing this process's reactor."""

    def __init__(self, settings: Settings, spiders: Sequence[str], hostname: str = "") -> None:
        self.settings = settings
        self.spiders = list(spiders)
        self.runner: Any = None
        self._stopping = False
        self.reopened = 0  # crawlers that closed while hosted, and were opened again
        self.gc_threshold = gc_threshold(settings)  # checked before anything opens
        prefix = setting(settings, "CELERY_CRAWL_KEY_PREFIX")
        client = connection.from_settings(settings)
        first = SpiderKeys.from_settings(self.spiders[0], settings) if self.spiders else None
        self.registration = WorkerRegistration(
            client,
            workers_key(prefix),
            self.spiders,
            hostname,
            repairer=Repairer(client, first) if first else None,
        )
        self.heartbeat = Heartbeat(
            "worker registry",
            self.registration.renew,
            setting(settings, "CELERY_CRAWL_HEARTBEAT_SECONDS"),
        )

    def start(self, timeout: float = 60.0) -> None:
        """Open every spider; returns once each is open (its engine starts right after), and
        the process is registered."""
        import crochet

        setup_reactor()
        crochet.run_in_reactor(detached(self._start))().wait(timeout)
        self.registration.renew()
        self.heartbeat.start()
        logger.info("hosting crawlers for %s", ", ".join(self.spiders))
        if setting(self.settings, "CELERY_CRAWL_GC_FREEZE"):
            logger.info("%d startup objects frozen out of the GC", freeze_startup_heap())
        if self.gc_threshold:
            gc.set_threshold(*self.gc_threshold)
            logger.info("GC thresholds set to %s", ", ".join(map(str, gc.get_threshold())))

    def _start(self) -> Any:
        from scrapy.crawler import CrawlerRunner
        from twisted.internet.defer import DeferredList

        self.runner = CrawlerRunner(self.settings)
        configure_reactor(self.runner)
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

    def _stopped(self, result: Any, name: str, opened: Any) -> Any:
        """A crawler stopped: at shutdown, as it should; otherwise it is opened again."""
        logger.info("crawler %s stopped", name)
        if not opened.called:  # it failed to open: let start() (or a reopening) see why
            opened.errback(result)
            return None
        if not self._stopping:
            self._reopen_later(name, result)
        return None

    def _reopen_later(self, name: str, result: Any) -> None:
        """A hosted crawler closed while the worker runs (an extension, a bug): open it again.

        Every job of the spider needs it; a worker that looks ready but crawls
        nothing is the one failure that must never be quiet. If it cannot open
        again, the process exits non-zero, so that its supervisor (or the
        prefork pool) starts a new one.
        """
        from twisted.internet import reactor, task

        self.reopened += 1
        why = result.getErrorMessage() if hasattr(result, "getErrorMessage") else "closed"
        logger.error(
            "crawler %s closed while hosted (%s); opening it again in %s s (reopened %d times)",
            name,
            why,
            REOPEN_DELAY,
            self.reopened,
        )
        task.deferLater(reactor, REOPEN_DELAY, self._reopen, name)

    def _reopen(self, name: str) -> None:
        if self._stopping:
            return
        try:
            opened = self._open(name)
        except Exception as exc:
            exit_unhosted(name, exc)
            return
        opened.addCallbacks(
            lambda _: logger.warning("crawler %s open again", name),
            lambda failure: exit_unhosted(name, failure),
        )

    def stop(self, timeout: float = 60.0) -> None:
        """Close every crawler: in-flight requests finish, leases held are handed back."""
        import crochet

        if self.runner is None:
            return
        self._stopping = True
        self.heartbeat.stop()
        try:
            self.registration.unregister()
        except connection.TRANSIENT_ERRORS as exc:
            logger.warning("could not leave the worker registry: %s", exc)
        try:
            crochet.run_in_reactor(detached(self._stop_crawlers))().wait(timeout)
        except crochet.TimeoutError:
            logger.warning("crawlers did not stop within %s s", timeout)

    def _stop_crawlers(self) -> Any:
        from twisted.internet.defer import DeferredList

        assert self.runner is not None
        return DeferredList([self._stop_crawler(crawler) for crawler in list(self.runner.crawlers)])

    def _stop_crawler(self, crawler: Any, waited: bool = False) -> Any:
        """Stop one crawler once its engine runs.

        ``Crawler.stop_async`` stops an engine only if it runs. A crawler still
        opening, or whose engine is still starting (its ``engine_started``
        handlers), would drop the stop and then run on: its leases would never be
        handed back. A stop right after :meth:`start` meets such crawlers (a
        prefork child told to exit as soon as it is up). So wait for the engine to
        run, or for the crawl to end, first; :meth:`stop`'s timeout bounds the wait.
        """
        from scrapy.utils.defer import deferred_from_coro
        from twisted.internet import reactor, task

        assert self.runner is not None
        if crawler in self.runner.crawlers and not crawler.engine.running:  # opening, starting
            if not waited:
                logger.info(
                    "crawler %s is still starting: it stops once its engine runs",
                    crawler.spidercls.name,
                )
            return task.deferLater(reactor, STARTING_POLL, self._stop_crawler, crawler, True)
        return deferred_from_coro(crawler.stop_async())


def exit_unhosted(name: str, error: Any) -> None:
    """A crawler closed and could not open again: the process exits, never idles on."""
    message = error.getErrorMessage() if hasattr(error, "getErrorMessage") else str(error)
    logger.critical(
        "crawler %s could not open again, so this worker process exits: %s", name, message
    )
    os._exit(EXIT_UNHOSTED)


def freeze_startup_heap() -> int:
    """Move every object alive now to the GC's permanent generation; how many it moved
    (those a parent froze before it forked this process are frozen already).

    Startup garbage is collected first: a frozen object is never freed. Objects
    made later (requests, responses, items) are collected as usual.
    """
    already = gc.get_freeze_count()  # frozen by a parent before it forked this process
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count() - already


def gc_threshold(settings: Any) -> tuple[int, ...]:
    """``CELERY_CRAWL_GC_THRESHOLD`` as ``gc.set_threshold``'s arguments; () keeps Python's."""
    values = setting(settings, "CELERY_CRAWL_GC_THRESHOLD")
    texts = [str(value).strip() for value in values]
    if len(texts) > 3 or not all(text.isdecimal() and int(text) > 0 for text in texts):
        raise ConfigError(
            f"CELERY_CRAWL_GC_THRESHOLD = {values!r}: give 1 to 3 positive integers, as"
            " gc.set_threshold takes them, or an empty list to keep Python's thresholds"
        )
    return tuple(int(text) for text in texts)


def keep_alive(spider: Any) -> None:
    """A hosted spider waits for more work instead of closing when idle."""
    from scrapy.exceptions import DontCloseSpider

    raise DontCloseSpider
