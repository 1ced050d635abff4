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
  then obeys nothing for that host, as Scrapy does, and one tries again later;
- the parsed ``Crawl-delay`` (for ``ROBOTSTXT_USER_AGENT``, or the user agent) becomes the
  site's least time between leases for every process (``SiteState.crawl_delay``),
  with no burst, unless the site's own limits space its requests more; and the
  downloads themselves start one delay apart, whichever process makes them
  (``SiteState.pace``): the requests leased before the delay was known wait their
  turn. Scrapy itself ignores ``Crawl-delay``.

Disallowed requests are dropped as Scrapy drops them (``robotstxt/forbidden``).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Self

from scrapy import signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Request
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler
from twisted.internet.defer import Deferred

from celery_crawl.core import connection, scripts
from celery_crawl.core.defaults import setting
from celery_crawl.core.keys import SpiderKeys, robots_key
from celery_crawl.core.scripts import Argv
from celery_crawl.politeness.middleware import sleep
from celery_crawl.politeness.sites import SitePolicy, SiteState

if TYPE_CHECKING:
    import redis
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

    def claim(self, netloc: str) -> tuple[str, bytes | None]:
        """``("body", body)`` when a fetched copy is there (None: the fetch failed),
        ``("fetch", None)`` when this process is to fetch it, ``("wait", None)`` else."""
        call = scripts.script(self.client, CLAIM.script)
        args = CLAIM.build(owner=self.owner, claim_ms=int(CLAIM_SECONDS * 1000))
        outcome, body, *ok = call(keys=[robots_key(self.prefix, netloc)], args=args)
        outcome = outcome.decode() if isinstance(outcome, bytes) else str(outcome)
        return outcome, bytes(body) if outcome == "body" and ok == [b"1"] else None

    def store(self, netloc: str, body: bytes | None) -> None:
        """The fetched body (None: the fetch failed), for every process; one transaction."""
        key = robots_key(self.prefix, netloc)
        seconds = self.seconds if body is not None else min(self.seconds, FAILED_SECONDS)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping={"body": (body or b"")[:MAX_BODY], "ok": int(body is not None)})
            pipe.expire(key, max(1, int(seconds)))
            pipe.execute()


class SharedRobotsTxtMiddleware(RobotsTxtMiddleware):
    """``DOWNLOADER_MIDDLEWARES = {"celery_crawl.politeness.SharedRobotsTxtMiddleware": 100}``
    in place of Scrapy's ``RobotsTxtMiddleware``; installed in hosted crawlers."""

    def __init__(self, crawler: Crawler, robots: SharedRobots, sites: SiteState) -> None:
        super().__init__(crawler)  # NotConfigured without ROBOTSTXT_OBEY
        self.robots = robots
        self.sites = sites
        self._expires: dict[str, float] = {}  # netloc -> when this process reads it again
        self._delayed: set[str] = set()  # the sites with a Crawl-delay: paced at download

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        assert crawler.spidercls is not None
        settings = crawler.settings
        client = connection.from_settings(settings)
        seconds = float(setting(settings, "ROBOTSTXT_SHARED_SECONDS"))
        robots = SharedRobots(client, str(setting(settings, "CELERY_CRAWL_KEY_PREFIX")), seconds)
        keys = SpiderKeys.from_settings(crawler.spidercls.name, settings)
        return cls(crawler, robots, SiteState(client, keys, SitePolicy.from_settings(settings)))

    async def process_request(self, request: Request, spider: Any = None) -> None:
        """Scrapy's rules, then the site's Crawl-delay for every process together."""
        await super().process_request(request)
        if self._delayed and not request.meta.get("dont_obey_robotstxt"):
            site = self.sites.policy.site_of(request)
            if site in self._delayed:
                wait = self.sites.pace(site)
                if wait > 0:
                    await sleep(wait / 1000)

    async def robot_parser(self, request: Request) -> RobotParser | None:
        netloc = urlparse_cached(request).netloc
        known, expired = netloc in self._parsers, time.monotonic() >= self._expires.get(netloc, 0)
        if known and expired and not isinstance(self._parsers[netloc], Deferred):
            del self._parsers[netloc]  # read again (a read under way is awaited)
        if netloc not in self._parsers:
            self._parsers[netloc] = Deferred()
            self._expires[netloc] = time.monotonic() + self.robots.seconds
            parser = await self._read(request, netloc)
            waiting = self._parsers[netloc]
            self._parsers[netloc] = parser
            assert isinstance(waiting, Deferred)
            waiting.callback(parser)
            return parser
        return await super().robot_parser(request)  # this process's copy, or its read under way

    async def _read(self, request: Request, netloc: str) -> RobotParser | None:
        """The host's parser, from the copy in Redis or fetched for all; None obeys nothing."""
        deadline = time.monotonic() + CLAIM_SECONDS + 5
        while True:
            outcome, body = self.robots.claim(netloc)
            if outcome == "body":
                self._stats.inc_value("robotstxt/shared")
                return await self._parsed(request, body)
            if outcome == "fetch" or time.monotonic() >= deadline:
                body = await self._fetch(request)
                self.robots.store(netloc, body)
                return await self._parsed(request, body)
            await sleep(WAIT_STEP)

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
        return bytes(response.body)

    async def _parsed(self, request: Request, body: bytes | None) -> RobotParser | None:
        if body is None:
            self.sites.crawl_delay(self.sites.policy.site_of(request), None)
            return None
        parser = build_from_crawler(self._parserimpl, self.crawler, body)
        await self.crawler.signals.send_catch_log_async(
            signal=signals.robots_parsed, robotparser=parser, request=request
        )
        delay = crawl_delay(parser, self._useragent(request))
        site = self.sites.policy.site_of(request)
        self.sites.crawl_delay(site, delay)
        if delay:
            self._delayed.add(site)
        else:
            self._delayed.discard(site)
        return parser

    def _useragent(self, request: Request) -> str:
        agent: Any = self._robotstxt_useragent or request.headers.get(
            b"User-Agent", self._default_useragent
        )
        return agent.decode() if isinstance(agent, bytes) else str(agent)


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
