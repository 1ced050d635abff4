"""Per-site politeness: limits that every process of a spider shares.

A **site** is what a request counts against: its URL's host by default
(``SITE_KEY``: ``host``, ``domain`` or ``ip``; ``meta["site"]`` wins). The
scheduler writes the site into the request's queue entry, and the lease script
(``queue/lua/lease.lua``) holds each site to its limits, for all processes at once:

- ``SITE_CONCURRENCY`` requests leased at once (a lease is held from the lease
  to the ack, so this bounds the requests in flight at the site);
- ``SITE_RATE`` requests per second, with a burst of ``SITE_BURST``;
- a pause set by a back-off (below).

An entry whose site may not take one more request now is *parked* under its
site instead of leased, and the queue behind it keeps flowing: a slow site
never holds back the others (``politeness/lua/include/sites.lua``).

``celery_crawl.politeness.SiteLimitsMiddleware`` shares what responses say
about a site, through :class:`SiteState`:

- a 429 (``SITE_BACKOFF_CODES``), or a server error with a ``Retry-After``,
  pauses the site for every process: for its ``Retry-After``, or else for a
  back-off that doubles with each one in a row; after ``SITE_PAUSE_AFTER`` in a
  row the site is paused for ``SITE_PAUSE_SECONDS``, its requests kept;
- other server errors (``SITE_OVERLOAD_CODES``) are retried as in plain Scrapy,
  and slow the site only when they are more than ``SITE_OVERLOAD_SHARE`` of its
  recent responses: its rate drops below what it served, then recovers;
- with Scrapy's ``AUTOTHROTTLE_ENABLED``, the latency of each response feeds
  one shared estimate per site, which spaces the site's leases (AutoThrottle's
  formula, for the whole crawl instead of one process);
- just before a download, the site's pause is checked again, so a request
  leased before another process saw a 429 waits out the pause too.
"""

from __future__ import annotations

import functools
import logging
import socket
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Self

import redis
import tldextract
from scrapy.utils.httpobj import urlparse_cached

from celery_crawl.core import scripts
from celery_crawl.core.bad_values import BadValues
from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.repair import Repairer, retried
from celery_crawl.core.scripts import Argv

if TYPE_CHECKING:
    from scrapy import Request

    from celery_crawl.core.keys import SpiderKeys

logger = logging.getLogger(__name__)

SITE_META = "site"  # request.meta["site"]: the site a request counts against
SITE_KEYS = ("host", "domain", "ip")
MAX_SITE = 255  # bytes: an entry's header holds the site's length in one byte
LIMIT_FIELDS = ("concurrency", "rate", "burst")
# the lease script's ARGV fields that hold a lease to its site's limits (queue/lua/lease.lua)
SITE_LEASE_ARGV = ("sites", "default_limits", "overrides")
FEEDBACK = Argv("site_feedback", ("site", "mode", "recovery_ms"), tail=("mode_arguments",))
# each mode of site_feedback.lua and the arguments it takes after FEEDBACK's fields, in
# order: declared once, here; the script reads them by these names, from the table
# generated from this one (lua_feedback_modes). ``ok`` takes its arguments with
# AutoThrottle only.
FEEDBACK_MODES: dict[str, tuple[str, ...]] = {
    "gate": (),
    "backoff": ("retry_after_ms", "first_ms", "longest_ms", "pause_after", "pause_ms"),
    "error": ("share", "window", "least", "longest_ms"),
    "ok": ("latency_ms", "target", "start_ms", "lowest_ms", "highest_ms", "status"),
    "robots": ("crawl_delay_ms",),
}
PACE = Argv("robots_pace", ())


def mode_arguments(mode: str, arguments: dict[str, Any]) -> list[Any]:
    """The ARGV tail of ``site_feedback.lua``'s ``mode``: ``arguments`` in
    :data:`FEEDBACK_MODES`' order (none at all for ``ok`` without AutoThrottle)."""
    if mode == "ok" and not arguments:
        return []
    return scripts.ordered(f"site_feedback.lua's {mode}", FEEDBACK_MODES[mode], arguments)


def lua_feedback_modes() -> str:
    """The Lua table of :data:`FEEDBACK_MODES` (``politeness/lua/site_feedback.lua``)."""
    return scripts.lua_constants(MODE_ARGUMENTS=FEEDBACK_MODES)


_registered_domain = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)


@dataclass(frozen=True)
class Limits:
    """A site's limits: 0 lifts a limit."""

    concurrency: int = 0
    rate: float = 0.0
    burst: int = 1

    def encoded(self) -> str:
        """``"concurrency interval_ms burst"``, as the lease script reads it."""
        interval = 1000.0 / self.rate if self.rate > 0 else 0.0
        return f"{max(0, self.concurrency)} {interval:.3f} {max(1, self.burst)}"

    def over(self, fields: dict[str, Any], site: str) -> Limits:
        unknown = set(fields) - set(LIMIT_FIELDS)
        if unknown:
            raise ConfigError(
                f"SITE_OVERRIDES[{site!r}] has {sorted(unknown)}: use {', '.join(LIMIT_FIELDS)}"
            )
        return Limits(
            int(fields.get("concurrency", self.concurrency)),
            float(fields.get("rate", self.rate)),
            int(fields.get("burst", self.burst)),
        )


@dataclass(frozen=True)
class Backoff:
    """How a back-off code slows a site (``SITE_BACKOFF_*``, ``SITE_PAUSE_*``)."""

    codes: frozenset[int] = frozenset({429})
    first: float = 1.0
    longest: float = 60.0
    pause_after: int = 8
    pause: float = 300.0

    def args(self, retry_after: float | None) -> dict[str, Any]:
        """The arguments of ``politeness/lua/site_feedback.lua``'s ``backoff``."""
        given = -1 if retry_after is None else int(min(retry_after, self.longest) * 1000)
        first, longest, pause = (int(s * 1000) for s in (self.first, self.longest, self.pause))
        return {
            "retry_after_ms": given,
            "first_ms": first,
            "longest_ms": longest,
            "pause_after": self.pause_after,
            "pause_ms": pause,
        }


@dataclass(frozen=True)
class Overload:
    """When server errors slow a site (``SITE_OVERLOAD_*``): more than an isolated share."""

    codes: frozenset[int] = frozenset({500, 502, 503, 504, 522, 524})
    share: float = 0.1
    window: int = 100
    least: int = 50
    recovery: float = 30.0

    def __post_init__(self) -> None:
        if not 0 < self.share < 1 or self.least < 1 or self.window < self.least:
            raise ConfigError(
                "SITE_OVERLOAD_SHARE is in (0, 1), and 1 <= SITE_OVERLOAD_MIN_RESPONSES"
                " <= SITE_OVERLOAD_WINDOW"
            )

    def args(self, longest: float) -> dict[str, Any]:
        """The arguments of ``politeness/lua/site_feedback.lua``'s ``error``."""
        return {
            "share": self.share,
            "window": self.window,
            "least": self.least,
            "longest_ms": int(longest * 1000),
        }


@dataclass(frozen=True)
class AutoThrottle:
    """Scrapy's AutoThrottle settings, applied to one shared estimate per site."""

    target: float = 1.0
    start: float = 5.0
    low: float = 0.0
    high: float = 60.0

    def args(self, latency: float, status: int) -> dict[str, Any]:
        """The arguments of ``politeness/lua/site_feedback.lua``'s ``ok``."""
        return {
            "latency_ms": int(latency * 1000),
            "target": self.target,
            "start_ms": int(self.start * 1000),
            "lowest_ms": int(self.low * 1000),
            "highest_ms": int(self.high * 1000),
            "status": status,
        }


@dataclass(frozen=True)
class SitePolicy:
    """What a site is and what it may take, from the settings."""

    enabled: bool = True
    key: str = "host"
    limits: Limits = Limits()
    overrides: dict[str, Limits] = field(default_factory=dict)
    backoff: Backoff = Backoff()
    overload: Overload = Overload()
    autothrottle: AutoThrottle | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> Self:
        key = setting(settings, "SITE_KEY")
        if key not in SITE_KEYS:
            raise ConfigError(f"SITE_KEY is {key!r}: use one of {', '.join(SITE_KEYS)}")
        limits = default_limits(settings)
        overrides = {
            site: limits.over(dict(fields), site)
            for site, fields in setting(settings, "SITE_OVERRIDES").items()
        }
        for site in overrides:
            check_site(site)
        return cls(
            setting(settings, "SITE_LIMITS_ENABLED"),
            key,
            limits,
            overrides,
            backoff_of(settings),
            overload_of(settings),
            autothrottle_of(settings),
        )

    def site_of(self, request: Request) -> str:
        """The site ``request`` counts against; ``""`` when limits are off or it has no host."""
        if not self.enabled:
            return ""
        given = request.meta.get(SITE_META)
        if given is not None:
            return check_site(str(given))
        host = (urlparse_cached(request).hostname or "").lower()
        if not host:
            return ""
        if self.key == "domain":
            return _registered_domain(host).top_domain_under_public_suffix or host
        if self.key == "ip":
            return resolved(host)
        return host

    def lease_args(self) -> dict[str, str]:
        """The lease script's ARGV fields of :data:`SITE_LEASE_ARGV` (``queue/lua/lease.lua``):
        '' when limits are off."""
        if not self.enabled:
            return dict.fromkeys(SITE_LEASE_ARGV, "")
        return {
            "sites": "sites",
            "default_limits": self.limits.encoded(),
            "overrides": "1" if self.overrides else "0",
        }


def default_limits(settings: Any) -> Limits:
    """SITE_CONCURRENCY, SITE_RATE and SITE_BURST, with Scrapy's own settings as defaults."""
    concurrency = setting(settings, "SITE_CONCURRENCY")
    if concurrency < 0:
        concurrency = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
    rate = setting(settings, "SITE_RATE")
    if rate < 0:
        delay = settings.getfloat("DOWNLOAD_DELAY")
        rate = 1.0 / delay if delay > 0 else 0.0
    return Limits(int(concurrency), float(rate), setting(settings, "SITE_BURST"))


def backoff_of(settings: Any) -> Backoff:
    return Backoff(
        frozenset(int(c) for c in setting(settings, "SITE_BACKOFF_CODES")),
        setting(settings, "SITE_BACKOFF_SECONDS"),
        setting(settings, "SITE_BACKOFF_MAX"),
        setting(settings, "SITE_PAUSE_AFTER"),
        setting(settings, "SITE_PAUSE_SECONDS"),
    )


def overload_of(settings: Any) -> Overload:
    return Overload(
        frozenset(int(c) for c in setting(settings, "SITE_OVERLOAD_CODES")),
        setting(settings, "SITE_OVERLOAD_SHARE"),
        setting(settings, "SITE_OVERLOAD_WINDOW"),
        setting(settings, "SITE_OVERLOAD_MIN_RESPONSES"),
        setting(settings, "SITE_OVERLOAD_RECOVERY"),
    )


def autothrottle_of(settings: Any) -> AutoThrottle | None:
    if not settings.getbool("AUTOTHROTTLE_ENABLED"):
        return None
    return AutoThrottle(
        settings.getfloat("AUTOTHROTTLE_TARGET_CONCURRENCY"),
        settings.getfloat("AUTOTHROTTLE_START_DELAY"),
        settings.getfloat("DOWNLOAD_DELAY"),
        settings.getfloat("AUTOTHROTTLE_MAX_DELAY"),
    )


def check_site(site: str) -> str:
    if not site or len(site.encode()) > MAX_SITE or site.startswith("~"):
        raise ConfigError(
            f"site {site[:40]!r}: a site key is 1 to {MAX_SITE} bytes and does not start with '~'"
        )
    return site


@functools.lru_cache(maxsize=4096)
def resolved(host: str) -> str:
    """SITE_KEY ``ip``: the address ``host`` resolves to (the host itself if it does not)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def retry_after(value: bytes | str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for: a number, or an HTTP date; None if absent."""
    if not value:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if text.isdigit():
        return float(text)
    try:
        return max(0.0, parsedate_to_datetime(text).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class SiteState:
    """The shared state of one spider's sites in Redis (``politeness/lua/include/sites.lua``)."""

    def __init__(
        self, client: redis.Redis, keys: SpiderKeys, policy: SitePolicy | None = None
    ) -> None:
        self.client = client
        self.keys = keys
        self.policy = policy or SitePolicy()
        self.repairer = Repairer(client, keys)  # a site's key refused: moved aside, sent again

    def publish_limits(self) -> None:
        """Write SITE_OVERRIDES for the lease script: one transaction, replacing the old ones."""
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.site_limits)
            if self.policy.overrides:
                pairs = [(site, lim.encoded()) for site, lim in self.policy.overrides.items()]
                pipe.hset(self.keys.site_limits, items=[x for pair in pairs for x in pair])
            pipe.execute()

    def gate(self, site: str) -> tuple[int, int]:
        """(ms the site is still paused, back-offs in a row), in one call."""
        wait, strikes, _ = self._feedback(site, "gate")
        return wait, strikes

    def backoff(self, site: str, seconds: float | None) -> int:
        """A back-off code or error from ``site``: pause it for every process; the pause in ms."""
        return self._feedback(site, "backoff", self.policy.backoff.args(seconds))[0]

    def server_error(self, site: str) -> int:
        """A server error without ``Retry-After``: counted in the site's window of responses.

        Returns the ms between leases it slowed the site to; 0 while the errors are isolated.
        """
        args = self.policy.overload.args(self.policy.backoff.longest)
        return self._feedback(site, "error", args)[2]

    def success(self, site: str, latency: float | None, status: int) -> None:
        """A response that is not a back-off: strikes end; the shared AutoThrottle learns."""
        throttle = self.policy.autothrottle
        if throttle is None or latency is None:
            self._feedback(site, "ok")
        else:
            self._feedback(site, "ok", throttle.args(latency, status))

    def crawl_delay(self, site: str, seconds: float | None) -> None:
        """The site's robots.txt ``Crawl-delay``: the least time between its leases, for
        every process, unless its own limits space them more (None lifts it)."""
        self._feedback(site, "robots", {"crawl_delay_ms": int((seconds or 0) * 1000)})

    def pace(self, site: str) -> int:
        """The ms to wait before a download from a site with a ``Crawl-delay``, so that
        downloads from every process start one delay apart (``lua/robots_pace.lua``)."""
        pace = scripts.script(self.client, PACE.script)
        return int(pace(keys=[self.keys.site(site)], args=PACE.build()))

    def _feedback(
        self, site: str, mode: str, arguments: dict[str, Any] | None = None
    ) -> tuple[int, int, int]:
        keys = [self.keys.site(site), self.keys.site_known, self.keys.site_leases(site)]
        rest = mode_arguments(mode, arguments or {})
        recovery = int(self.policy.overload.recovery * 1000)
        feedback = scripts.script(self.client, FEEDBACK.script)
        args = FEEDBACK.build(site=site, mode=mode, recovery_ms=recovery)
        args += FEEDBACK.rest(mode_arguments=rest)
        found = retried(self.repairer, lambda: feedback(keys=keys, args=args))
        wait, strikes, slowed = (int(x) for x in found)
        return wait, strikes, slowed

    def read(self, bad: BadValues | None = None) -> dict[str, dict[str, str]]:
        """Every known site's state fields and its leases held now (``inflight``).

        Two round trips, two commands per site. A site whose name, fields or
        keys are not what they should be is noted in ``bad`` and left out.
        """
        bad = BadValues() if bad is None else bad
        known = self.keys.site_known
        members = bad.reply(known, self._members(known)) or set()
        sites = sorted(s for s in (bad.text(known, m, "site name") for m in members) if s)
        now_ms = int(time.time() * 1000)
        with self.client.pipeline(transaction=False) as pipe:
            for site in sites:
                pipe.hgetall(self.keys.site(site))
                pipe.zcount(self.keys.site_leases(site), now_ms, "+inf")
            found = pipe.execute(raise_on_error=False)
        states = {}
        for site, values, inflight in zip(sites, found[::2], found[1::2], strict=True):
            fields = bad.text_hash(self.keys.site(site), values)
            if bad.reply(self.keys.site_leases(site), inflight) is not None:
                states[site] = {**fields, "inflight": str(inflight)}
        return states

    def _members(self, key: str) -> Any:
        try:
            return self.client.smembers(key)
        except redis.ResponseError as exc:
            return exc


@dataclass(frozen=True)
class SiteReading:
    """One site, as status and the exporter show it."""

    site: str
    in_flight: int
    leased: int
    parked: int  # requests that had to wait for the site
    backoffs: int
    slowdowns: int  # times its server errors slowed it
    paused_for: float  # seconds the site is still paused
    paused_total: float  # seconds it was paused by back-offs, over its life
    delay: float  # the interval its leases keep now (a slowdown's or AutoThrottle's), seconds

    @classmethod
    def parse(cls, site: str, fields: dict[str, str], now: float) -> SiteReading:
        def number(name: str) -> float:
            try:
                return float(fields.get(name) or 0)
            except ValueError:
                return 0.0

        return cls(
            site,
            int(number("inflight")),
            int(number("leased")),
            int(number("parked")),
            int(number("backoffs")),
            int(number("slowdowns")),
            max(0.0, number("until") / 1000 - now),
            number("paused_ms") / 1000,
            number("delay") / 1000,
        )


def read_sites(
    client: redis.Redis, keys: SpiderKeys, bad: BadValues | None = None
) -> list[SiteReading]:
    """The group's sites, busiest first (in flight, then paused, then leased)."""
    now = time.time()
    states = SiteState(client, keys).read(bad)
    found = [SiteReading.parse(s, f, now) for s, f in states.items()]
    return sorted(found, key=lambda r: (-r.in_flight, -r.paused_for, -r.leased, r.site))
