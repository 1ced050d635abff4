"""The downloader side of per-site politeness (:mod:`celery_crawl.politeness.sites`).

:class:`SiteLimitsMiddleware`, installed in hosted crawlers, checks a site's
shared pause just before each download, and reports what responses say: a
back-off code pauses the site for every process, server errors slow it once
they are more than an isolated share of its responses, and with AutoThrottle
the latency feeds the site's shared estimate.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Self

import redis

from celery_crawl.core import connection
from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.politeness.sites import SitePolicy, SiteState, retry_after

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)
MIDDLEWARE = "celery_crawl.politeness.SiteLimitsMiddleware"
# A process asks whether a site is paused at most once per GATE_SECONDS: a pause set by
# another process reaches this one within that long (its own, at once).
GATE_SECONDS = 0.025
MAX_REMEMBERED = 10_000  # sites whose last check this process remembers


class SiteLimitsMiddleware:
    """``DOWNLOADER_MIDDLEWARES = {"celery_crawl.politeness.SiteLimitsMiddleware": 800}``.

    Installed in hosted crawlers. Checks the site's pause just before each
    download (asking Redis at most once per ``GATE_SECONDS`` per site), and
    reports back-offs, server errors (and, with AutoThrottle, latencies) to the
    site's shared state: one call per such response, none for a plain success.
    """

    def __init__(self, state: SiteState, crawler: Crawler | None = None) -> None:
        self.state = state
        self.policy = state.policy
        self.crawler = crawler
        self._open: dict[str, float] = {}  # site -> not paused until (monotonic)
        # Sites with back-offs in a row that this process knows of: the next success from
        # any of them, whenever it was sent, ends the row (one call, then not again).
        self._struck: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        assert crawler.spidercls is not None
        settings = crawler.settings
        keys = SpiderKeys.from_settings(crawler.spidercls.name, settings)
        client = connection.from_settings(settings)
        return cls(SiteState(client, keys, SitePolicy.from_settings(settings)), crawler)

    async def process_request(self, request: Request) -> None:
        site = self._site(request)
        if not site:
            return
        for _ in range(100):  # bounded: a site paused again and again keeps waiting
            if time.monotonic() < self._open.get(site, 0.0):
                return
            try:
                wait, strikes = self.state.gate(site)
            except connection.REFUSED_OR_TRANSIENT as exc:  # the lease held the site to its limits
                if not isinstance(exc, connection.AWAY_OR_FULL):  # a damaged key, repaired
                    logger.warning("site %s not checked, Redis refused (%s): it goes on", site, exc)
                return
            if strikes:
                self._mark_struck(site)
            if wait <= 0:
                self._remember(site)
                return
            self._inc("celery_crawl/site/gate_waits")
            await sleep(wait / 1000)

    def _remember(self, site: str) -> None:
        """The site is not paused: for GATE_SECONDS, this process does not ask again."""
        if len(self._open) >= MAX_REMEMBERED:
            self._open.clear()
        self._open[site] = time.monotonic() + GATE_SECONDS

    def _mark_struck(self, site: str) -> None:
        if len(self._struck) >= MAX_REMEMBERED:
            self._struck.clear()  # their rows then end at the next back-off's success instead
        self._struck.add(site)

    def process_response(self, request: Request, response: Any) -> Any:
        site = self._site(request)
        if not site:
            return response
        try:
            self._report(site, request, response)
        except connection.TRANSIENT_ERRORS as exc:
            connection.warn_away(logger, "Redis unreachable, site %s not updated: %s", site, exc)
        except redis.ResponseError as exc:  # a damaged site key: the response still counts
            logger.warning(
                "site %s not updated, Redis refused (%s): the response goes on", site, exc
            )
        return response

    def _report(self, site: str, request: Request, response: Any) -> None:
        """A 429 or a 5xx with Retry-After pauses the site; other 5xx count towards a slowdown."""
        status, header = response.status, response.headers.get(b"Retry-After")
        overload = status in self.policy.overload.codes
        if status in self.policy.backoff.codes or (overload and header):
            self._open.pop(site, None)
            self._mark_struck(site)
            wait = self.state.backoff(site, retry_after(header))
            self._backed_off(site, wait, status)
        elif overload:
            self._slowed(site, self.state.server_error(site), status)
        elif site in self._struck or self.policy.autothrottle is not None:
            latency = request.meta.get("download_latency")
            self.state.success(site, latency, status)
            self._struck.discard(site)

    def _site(self, request: Request) -> str:
        try:
            return self.policy.site_of(request)
        except ConfigError:
            return ""  # the scheduler dropped such a request: it is not downloaded

    def _backed_off(self, site: str, wait_ms: int, cause: int | str) -> None:
        self._inc("celery_crawl/site/backoffs")
        logger.info("site %s paused for %.1f s (%s), in every process", site, wait_ms / 1000, cause)

    def _slowed(self, site: str, interval_ms: int, status: int) -> None:
        if interval_ms <= 0:
            return  # an isolated error: Scrapy's retry middleware retries it, nothing more
        self._inc("celery_crawl/site/slowdowns")
        logger.info(
            "site %s slowed to %.2f requests/s (%s: server errors are a large share of its"
            " responses), in every process",
            site,
            1000 / interval_ms,
            status,
        )

    def _inc(self, key: str) -> None:
        if self.crawler is not None and self.crawler.stats is not None:
            self.crawler.stats.inc_value(key)


def check_installed(settings: Any) -> None:
    """With site limits on and the middleware missing (a plain ``scrapy crawl``), say so once:
    the limits still hold at the lease, but 429s are not shared."""
    from scrapy.utils.conf import build_component_list
    from scrapy.utils.misc import load_object

    if not setting(settings, "SITE_LIMITS_ENABLED"):
        return
    paths = build_component_list(settings.getwithbase("DOWNLOADER_MIDDLEWARES"))
    classes = [load_object(path) if isinstance(path, str) else path for path in paths]
    if not any(isinstance(c, type) and issubclass(c, SiteLimitsMiddleware) for c in classes):
        logger.info(
            "site limits hold at the lease, but 429/503 back-offs are not shared: add"
            " DOWNLOADER_MIDDLEWARES = {%r: 800} (docs/politeness.md)",
            MIDDLEWARE,
        )


async def sleep(seconds: float) -> None:
    """Wait in the reactor, whichever reactor runs."""
    from scrapy.utils.defer import maybe_deferred_to_future
    from twisted.internet import reactor, task

    await maybe_deferred_to_future(task.deferLater(reactor, seconds))
