"""robots.txt fetched once for every process, and its ``Crawl-delay`` shared.

Scrapy's ``RobotsTxtMiddleware`` fetches a host's robots.txt in each process that
crawls it: with forty worker processes, forty fetches per host, and each process
obeys it alone. :class:`SharedRobotsTxtMiddleware` (installed in hosted crawlers in
its place, active with ``ROBOTSTXT_OBEY`` as Scrapy's is) keeps one copy per host in
Redis (:func:`celery_crawl.core.keys.robots_key`) for ``ROBOTSTXT_SHARED_SECONDS``:

- the first process that needs it claims the fetch (``politeness/lua/robots_claim.lua``)
  and stores the answer; the others wait for it, bounded, then read it. A claim whose
  process died lapses after :data:`CLAIM_SECONDS`, and another process fetches;
- a download that fails is stored too, for :data:`FAILED_SECONDS`: every process
  then obeys nothing for that host, as Scrapy does, and one tries again later. Each
  process keeps its own parsed copy as long as the one in Redis lives, no longer;
- when Redis refuses, the process fetches robots.txt for itself, as Scrapy does, and
  tries to share again after :data:`FAILED_SECONDS`; ``robotstxt/shared_errors`` counts it;
- the parsed ``Crawl-delay`` (for ``ROBOTSTXT_USER_AGENT``, or the user agent), capped
  at ``ROBOTSTXT_CRAWL_DELAY_MAX``, becomes the site's least time between leases for
  every process (``SiteState.crawl_delay``), unless the site's own limits space its
  requests more, and allows it no burst whatever they say; and the downloads themselves
  start one delay apart, whichever process makes them (``SiteState.pace``): the requests
  leased before the delay was known wait their turn. Scrapy itself ignores
  ``Crawl-delay``.

Disallowed requests are dropped as Scrapy drops them (``robotstxt/forbidden``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Self, cast

import redis
from scrapy import signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Request
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler
from twisted.internet.defer import CancelledError, Deferred

from celery_crawl.core import connection, scripts
from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys, robots_key
from celery_crawl.core.scripts import Argv
from celery_crawl.politeness.middleware import sleep
from celery_crawl.politeness.sites import SitePolicy, SiteState

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.robotstxt import RobotParser

logger = logging.getLogger(__name__)

CLAIM = Argv("robots_claim", ("owner", "claim_ms"))
CLAIM_SECONDS = 60.0  # a fetch claimed and not stored by then: another process fetches
FAILED_SECONDS = 300.0  # a failed fetch is shared this long, then tried again
MAX_BODY = 512 * 1024  # bytes of robots.txt kept, as Google reads at most 500 KiB
WAIT_STEP = 0.1  # seconds between looks for a fetch another process claimed


class SharedRobots:
    """The robots.txt copies in Redis of one project (``prefix``)."""

    def __init__(self, client: redis.Redis, prefix: str, seconds: float) -> None:
        self.client = client
        self.prefix = prefix
        self.seconds = seconds
        self.owner = uuid.uuid4().hex

    def claim(self, netloc: str) -> tuple[str, bytes | None, float]:
        """``("body", body, seconds)`` when a fetched copy is there (body None: the fetch
        failed) and is kept ``seconds`` more; ``("fetch", None, 0)`` when this process is
        to fetch it; ``("wait", None, 0)`` while another process fetches it."""
        call = scripts.script(self.client, CLAIM.script)
        args = CLAIM.build(owner=self.owner, claim_ms=int(CLAIM_SECONDS * 1000))
        outcome, body, *rest = call(keys=[robots_key(self.prefix, netloc)], args=args)
        outcome = outcome.decode() if isinstance(outcome, bytes) else str(outcome)
        if outcome != "body":
            return outcome, None, 0.0
        ok, pttl = rest
        left = int(pttl) / 1000 if int(pttl) > 0 else self.seconds  # no expiry: a full term
        return outcome, bytes(body) if ok == b"1" else None, min(left, self.seconds)

    def kept(self, fetched: bool) -> float:
        """How long a copy stored now is kept: a failed fetch at most :data:`FAILED_SECONDS`."""
        return self.seconds if fetched else min(self.seconds, FAILED_SECONDS)

    def store(self, netloc: str, body: bytes | None) -> None:
        """The fetched body (None: the fetch failed), for every process; one transaction."""
        key = robots_key(self.prefix, netloc)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping={"body": (body or b"")[:MAX_BODY], "ok": int(body is not None)})
            pipe.pexpire(key, max(1, int(self.kept(body is not None) * 1000)))
            pipe.execute()


class SharedRobotsTxtMiddleware(RobotsTxtMiddleware):
    """``DOWNLOADER_MIDDLEWARES = {"celery_crawl.politeness.SharedRobotsTxtMiddleware": 100}``
    in place of Scrapy's ``RobotsTxtMiddleware``; installed in hosted crawlers."""

    def __init__(
        self, crawler: Crawler, robots: SharedRobots, sites: SiteState, delay_max: float = 0
    ) -> None:
        super().__init__(crawler)  # NotConfigured without ROBOTSTXT_OBEY
        self.robots = robots
        self.sites = sites
        self.delay_max = delay_max  # the longest Crawl-delay obeyed; 0: any
        self._expires: dict[str, float] = {}  # netloc -> when this process reads it again
        self._delays: dict[str, float] = {}  # the sites with a Crawl-delay: paced at download
        self._alone: dict[str, float] = {}  # site -> its next download while Redis refuses

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        assert crawler.spidercls is not None
        settings = crawler.settings
        if not settings.getbool("ROBOTSTXT_OBEY"):
            raise NotConfigured  # before any connection is made
        seconds = float(setting(settings, "ROBOTSTXT_SHARED_SECONDS"))
        delay_max = float(setting(settings, "ROBOTSTXT_CRAWL_DELAY_MAX"))
        if seconds <= 0 or delay_max < 0:
            raise ConfigError(
                f"ROBOTSTXT_SHARED_SECONDS must be > 0 (got {seconds}) and"
                f" ROBOTSTXT_CRAWL_DELAY_MAX >= 0 (got {delay_max})"
            )
        client = connection.from_settings(settings)
        robots = SharedRobots(client, str(setting(settings, "CELERY_CRAWL_KEY_PREFIX")), seconds)
        keys = SpiderKeys.from_settings(crawler.spidercls.name, settings)
        sites = SiteState(client, keys, SitePolicy.from_settings(settings))
        return cls(crawler, robots, sites, delay_max)

    async def process_request(self, request: Request, spider: Any = None) -> None:
        """Scrapy's rules, then the site's Crawl-delay for every process together."""
        await super().process_request(request)
        if self._delays and not request.meta.get("dont_obey_robotstxt"):
            site = self.sites.policy.site_of(request)
            if site in self._delays:
                wait = self._pace(site)
                if wait > 0:
                    await sleep(wait)

    def _pace(self, site: str) -> float:
        """Seconds until the site's next download may start: for every process together,
        or, while Redis refuses, for this process alone."""
        try:
            wait = self.sites.pace(site) / 1000
        except redis.RedisError as exc:
            if site not in self._alone:
                logger.warning(
                    "Crawl-delay of %s paced in this process, Redis refused: %s", site, exc
                )
            self._stats.inc_value("robotstxt/shared_errors")
            now = time.monotonic()
            start = max(now, self._alone.get(site, now))
            self._alone[site] = start + self._delays[site]
            return start - now
        self._alone.pop(site, None)
        return wait

    async def robot_parser(self, request: Request) -> RobotParser | None:
        """This process's copy while it lives; else one read for every request waiting."""
        netloc = urlparse_cached(request).netloc
        known = self._parsers.get(netloc, _ABSENT)
        if isinstance(known, Deferred):  # a read under way: wait for its parser
            return await maybe_deferred_to_future(_relay(known))
        if known is not _ABSENT and time.monotonic() < self._expires.get(netloc, 0):
            return cast("RobotParser | None", known)
        pending: Deferred[RobotParser | None] = Deferred()
        self._parsers[netloc] = pending
        parser, seconds = None, self.robots.kept(False)
        try:
            parser, seconds = await self._read(request, netloc)
        except (CancelledError, asyncio.CancelledError):  # the next request reads it again
            seconds = 0.0
            raise
        except Exception:  # a parser's failure or a signal handler's: obey nothing a while
            logger.exception("robots.txt of %s could not be read: obeying nothing", netloc)
            self._stats.inc_value("robotstxt/shared_errors")
        finally:  # never leave the waiters waiting
            self._parsers[netloc] = parser
            self._expires[netloc] = time.monotonic() + seconds
            pending.callback(parser)
        return parser

    async def _read(self, request: Request, netloc: str) -> tuple[RobotParser | None, float]:
        """The host's parser, from the copy in Redis or fetched for all (None obeys
        nothing), and how long this process may keep it."""
        deadline = time.monotonic() + CLAIM_SECONDS + 5
        while True:
            try:
                outcome, body, seconds = self.robots.claim(netloc)
            except redis.RedisError as exc:
                return await self._read_alone(request, netloc, exc)
            if outcome == "body":
                self._stats.inc_value("robotstxt/shared")
                return await self._parsed(request, body), seconds
            if outcome == "fetch" or time.monotonic() >= deadline:
                body = await self._fetch(request)
                try:
                    self.robots.store(netloc, body)
                except redis.RedisError as exc:
                    self._refused(netloc, exc)
                    return await self._parsed(request, body), self.robots.kept(False)
                return await self._parsed(request, body), self.robots.kept(body is not None)
            await sleep(WAIT_STEP)

    async def _read_alone(
        self, request: Request, netloc: str, exc: Exception
    ) -> tuple[RobotParser | None, float]:
        """Redis refused: fetched for this process, as Scrapy does; shared again later."""
        self._refused(netloc, exc)
        return await self._parsed(request, await self._fetch(request)), self.robots.kept(False)

    def _refused(self, netloc: str, exc: Exception) -> None:
        logger.warning("robots.txt of %s not shared, Redis refused: %s", netloc, exc)
        self._stats.inc_value("robotstxt/shared_errors")

    async def _fetch(self, request: Request) -> bytes | None:
        url = urlparse_cached(request)
        robotsreq = Request(
            f"{url.scheme}://{url.netloc}/robots.txt",
            priority=self.DOWNLOAD_PRIORITY,
            meta={"dont_obey_robotstxt": True},
            callback=NO_CALLBACK,
        )
        self._stats.inc_value("robotstxt/request_count")
        try:
            response = await self.crawler.engine.download_async(robotsreq)
        except Exception as exc:  # as Scrapy: the host's robots.txt obeys nothing
            if not isinstance(exc, IgnoreRequest):
                logger.error("Error downloading %s: %s", robotsreq, exc)
                self._stats.inc_value(f"robotstxt/exception_count/{type(exc)}")
            return None
        self._stats.inc_value("robotstxt/response_count")
        self._stats.inc_value(f"robotstxt/response_status_count/{response.status}")
        return bytes(response.body[:MAX_BODY])  # what every process reads from Redis

    async def _parsed(self, request: Request, body: bytes | None) -> RobotParser | None:
        site = self.sites.policy.site_of(request)
        if body is None:
            self._share_delay(site, None)
            return None
        parser = build_from_crawler(self._parserimpl, self.crawler, body)
        await self.crawler.signals.send_catch_log_async(
            signal=signals.robots_parsed, robotparser=parser, request=request
        )
        delay = crawl_delay(parser, self._useragent(request))
        if delay and self.delay_max and delay > self.delay_max:
            logger.info("%s asks a Crawl-delay of %g s: %g s kept", site, delay, self.delay_max)
            self._stats.inc_value("robotstxt/crawl_delay_capped")
            delay = self.delay_max
        self._share_delay(site, delay)
        return parser

    def _share_delay(self, site: str, delay: float | None) -> None:
        """The site's Crawl-delay, for every process (kept for this one when Redis refuses)."""
        if delay:
            self._delays[site] = delay
        else:
            self._delays.pop(site, None)
        try:
            self.sites.crawl_delay(site, delay)
        except redis.RedisError as exc:
            logger.warning("Crawl-delay of %s not shared, Redis refused: %s", site, exc)
            self._stats.inc_value("robotstxt/shared_errors")

    def _useragent(self, request: Request) -> str:
        agent: Any = self._robotstxt_useragent or request.headers.get(
            b"User-Agent", self._default_useragent
        )
        return agent.decode() if isinstance(agent, bytes) else str(agent)


_ABSENT: Any = object()  # no parser for the host in this process yet


def _relay(pending: Deferred[Any]) -> Deferred[Any]:
    """A Deferred of a waiter's own, fired with ``pending``'s result, which passes on
    unchanged: every request waiting on one read gets its parser. (Awaiting ``pending``
    itself, as Scrapy's middleware does, hands the parser to the first waiter and None,
    obey nothing, to the others.)"""
    own: Deferred[Any] = Deferred()

    def relay(result: Any) -> Any:
        own.callback(result)
        return result

    pending.addCallback(relay)
    return own


def crawl_delay(parser: Any, useragent: str) -> float | None:
    """The ``Crawl-delay`` that ``parser`` (Scrapy's Protego or Python parser) gives
    ``useragent``, in seconds; None when it gives none or it cannot tell."""
    inner = getattr(parser, "rp", None)
    method = getattr(inner, "crawl_delay", None)
    if method is None:
        return None
    try:
        value = method(useragent)
    except Exception:  # a parser's own failure: no delay rather than no crawl
        return None
    return float(value) if isinstance(value, int | float) and value > 0 else None
