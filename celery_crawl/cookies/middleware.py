"""Cookie jars per job, and shared by every process of a spider with ``COOKIES_SHARED``.

:class:`SharedCookiesMiddleware` takes the place of Scrapy's
``CookiesMiddleware`` (at 700; hosted crawlers get it by default). Jars are
kept apart by the ``cookiejar`` meta key, as in Scrapy, and by job: a request
of a job (it carries the job id) uses the job's own jars, so that each job
starts with empty jars, as a ``scrapy crawl`` run does.

For a spider without ``COOKIES_SHARED = True`` the jars are in the process,
as in Scrapy; a job's jars are dropped when the job ends in the process
(``job_finished``). A request outside any job is Scrapy's middleware,
unchanged. With it, each jar lives in Redis
(:mod:`celery_crawl.cookies.store`) and each process keeps a copy, dropped too
when the job ends in the process.

Consistency. A cookie a response sets is in Redis before that response's
callback runs. A process sends a request with its copy of the jar, brought
up to date first when:

- the request was derived from a response after a cookie change that this
  copy misses: the engine stamps every request it schedules with the jar
  version its process knows (``request.meta["celery_crawl_cookies"]``), so
  the pages a login's callback yields go out with the login's cookie,
  whichever process leases them;
- the copy was last checked ``COOKIES_SHARED_REFRESH`` seconds ago or more
  (one short round trip, which sends the cookies only if they changed).

A write that fails (Redis away) stays pending in the process and is retried
before the jar's next use; meanwhile the process uses its own copy.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Self

from scrapy import Request, Spider, signals
from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.http.cookies import CookieJar
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from celery_crawl.cookies.store import CookieStore, cookie_field, encode_cookie
from celery_crawl.core import connection
from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.core.repair import Repairer, retried
from celery_crawl.jobs.signals import job_finished, job_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

VERSION_META = "celery_crawl_cookies"
SCRAPY_MIDDLEWARE = "scrapy.downloadermiddlewares.cookies.CookiesMiddleware"
# jars kept in a process: older ones are dropped (and read again when needed)
MAX_LOCAL_JARS = 1024
# jobs whose in-process jars are kept: beyond, the least recently used job's are
# dropped (its end was not heard of: normally job_finished drops them)
MAX_JOBS_WITH_JARS = 4096


def jar_name(meta_value: Any) -> str:
    """The name of the jar the ``cookiejar`` meta key selects, the same in every process."""
    if meta_value is None:
        return "default"
    if isinstance(meta_value, list | tuple):  # a tuple comes back from the queue as a list
        return "-".join(jar_name(part) for part in meta_value)
    return f"{type(meta_value).__name__}.{meta_value}"


@dataclass
class LocalJar:
    """A process's copy of one shared jar."""

    key: str
    jar: CookieJar = field(default_factory=CookieJar)
    version: int = 0  # the Redis version this copy shows
    seen: int = 0  # the newest version known to exist
    checked_at: float = float("-inf")
    pending: dict[str, str | None] = field(default_factory=dict)  # field -> JSON, None: delete

    def snapshot(self) -> dict[str, str]:
        """Field -> JSON of every cookie in the copy that has not expired."""
        now = int(time.time())
        return {cookie_field(c): encode_cookie(c) for c in self.jar if not c.is_expired(now)}


class SharedCookiesMiddleware(CookiesMiddleware):
    """Scrapy's ``CookiesMiddleware``, over shared jars when ``store`` is given.

    Installed in its place (hosted crawlers have it by default)::

        DOWNLOADER_MIDDLEWARES = {
            "scrapy.downloadermiddlewares.cookies.CookiesMiddleware": None,
            "celery_crawl.cookies.SharedCookiesMiddleware": 700,
        }

    ``store`` None: Scrapy's in-process jars, a set per job (:meth:`job_jar`),
    nothing shared.
    """

    def __init__(
        self,
        debug: bool = False,
        *,
        store: CookieStore | None = None,
        keys: SpiderKeys | None = None,
        refresh: float = SETTINGS["COOKIES_SHARED_REFRESH"].default,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(debug)
        if store is not None and keys is None:
            raise ConfigError("a shared cookie store needs the spider's keys")
        self.store = store
        self.keys = keys
        # a jar of another type refused (nothing written): moved aside, stored again
        self.repairer = Repairer(store.client, keys) if store and keys else None
        self.refresh = refresh
        self.clock = clock
        self.local: OrderedDict[str, LocalJar] = OrderedDict()
        # without a store: job -> its jars, by cookiejar meta value (Scrapy's are self.jars)
        self.job_jars: OrderedDict[str, defaultdict[Any, CookieJar]] = OrderedDict()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        settings = crawler.settings
        if not settings.getbool("COOKIES_ENABLED"):
            raise NotConfigured
        debug = settings.getbool("COOKIES_DEBUG")
        if not setting(settings, "COOKIES_SHARED"):
            middleware = cls(debug)
        else:
            middleware = cls(
                debug,
                store=CookieStore(
                    connection.from_settings(settings), setting(settings, "COOKIES_SHARED_TTL")
                ),
                keys=SpiderKeys.from_settings(crawler.spidercls.name, settings),
                refresh=setting(settings, "COOKIES_SHARED_REFRESH"),
            )
            crawler.signals.connect(middleware.stamp, signal=signals.request_scheduled)
        crawler.signals.connect(middleware.forget_job, signal=job_finished)
        middleware.crawler = crawler
        return middleware

    # -- Scrapy's hooks ----------------------------------------------------

    def process_request(
        self, request: Request, spider: Spider | None = None
    ) -> Request | Response | None:
        if self.store is None:
            return self._process_request_here(request)
        if request.meta.get("dont_merge_cookies", False):
            return None
        local = self.jar_for(request)

        def add_request_cookies() -> None:  # Request(cookies=...) join the jar, as in Scrapy
            cookies = self._get_request_cookies(local.jar, request)
            self._process_cookies(cookies, jar=local.jar, request=request)

        if request.cookies:
            self._change(local, add_request_cookies)
        request.headers.pop("Cookie", None)
        local.jar.add_cookie_header(request)
        self._debug_cookie(request)
        return None

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        if self.store is None:
            return self._process_response_here(request, response)
        if request.meta.get("dont_merge_cookies", False):
            return response
        if not response.headers.getlist("Set-Cookie"):
            return response  # nothing to extract: no read, no write
        local = self.jar_for(request)

        def extract() -> None:
            cookies = local.jar.make_cookies(response, request)
            self._process_cookies(cookies, jar=local.jar, request=request)

        self._change(local, extract)
        self._debug_set_cookie(response)
        return response

    def forget_job(self, job_id: str, **_: Any) -> None:
        """``job_finished``: the job ended in this process; its jars go (what is pending is
        stored first)."""
        self.job_jars.pop(job_id, None)
        if self.keys is None:
            return
        prefix = self.keys.cookie_jar(job_id, "")
        for key in [key for key in self.local if key.startswith(prefix)]:
            self._flush(self.local[key])
            if not self.local[key].pending:
                del self.local[key]

    def stamp(self, request: Request, spider: Spider | None = None) -> None:
        """``request_scheduled``: the jar version the process knows goes with the request."""
        if self.keys is None or request.meta.get("dont_merge_cookies", False):
            return
        local = self.local.get(self.key_of(request))
        if local is not None and local.seen > int(request.meta.get(VERSION_META) or 0):
            request.meta[VERSION_META] = local.seen

    # -- the jars of jobs, in this process (no COOKIES_SHARED) ---------------

    def _process_request_here(self, request: Request) -> Request | Response | None:
        """Scrapy's ``process_request``, over the job's own jars."""
        job = job_of(request)
        if not job:
            return super().process_request(request)
        if request.meta.get("dont_merge_cookies", False):
            return None
        jar = self.job_jar(job, request.meta.get("cookiejar"))
        self._process_cookies(self._get_request_cookies(jar, request), jar=jar, request=request)
        request.headers.pop("Cookie", None)
        jar.add_cookie_header(request)
        self._debug_cookie(request)
        return None

    def _process_response_here(self, request: Request, response: Response) -> Response:
        """Scrapy's ``process_response``, over the job's own jars."""
        job = job_of(request)
        if not job:
            return super().process_response(request, response)  # type: ignore[return-value]
        if request.meta.get("dont_merge_cookies", False):
            return response
        jar = self.job_jar(job, request.meta.get("cookiejar"))
        self._process_cookies(jar.make_cookies(response, request), jar=jar, request=request)
        self._debug_set_cookie(response)
        return response

    def job_jar(self, job: str, name: Any) -> CookieJar:
        """The in-process jar ``name`` (the ``cookiejar`` meta value) of ``job``."""
        jars = self.job_jars.get(job)
        if jars is None:
            jars = self.job_jars[job] = defaultdict(CookieJar)
            if len(self.job_jars) > MAX_JOBS_WITH_JARS:
                oldest, _ = self.job_jars.popitem(last=False)
                logger.warning("cookie jars of job %s dropped: too many jobs in jars", oldest)
        self.job_jars.move_to_end(job)
        return jars[name]

    # -- the local copies --------------------------------------------------

    def key_of(self, request: Request) -> str:
        assert self.keys is not None
        return self.keys.cookie_jar(job_of(request), jar_name(request.meta.get("cookiejar")))

    def jar_for(self, request: Request) -> LocalJar:
        """The process's copy of the request's jar, brought up to date as needed."""
        key = self.key_of(request)
        local = self.local.get(key)
        if local is None:
            local = self.local[key] = LocalJar(key)
            self._evict()
        self.local.move_to_end(key)
        stamped = request.meta.get(VERSION_META)
        if isinstance(stamped, int) and stamped > local.seen:
            local.seen = stamped
        self._flush(local)
        stale = self.clock() - local.checked_at >= self.refresh
        if not local.pending and (stale or local.seen > local.version):
            self._refresh(local)
        return local

    def _evict(self) -> None:
        for key in list(self.local)[: max(len(self.local) - MAX_LOCAL_JARS, 0)]:
            if not self.local[key].pending:
                del self.local[key]

    def _refresh(self, local: LocalJar) -> None:
        assert self.store is not None
        local.checked_at = self.clock()
        read = partial(self.store.read, local.key, local.version)
        try:
            state = retried(self.repairer, read) if self.repairer else read()
        except connection.REFUSED_OR_TRANSIENT as exc:
            logger.warning("shared cookies not read, using this process's copy: %s", exc)
            self._inc("cookies_shared/read_errors")
            return
        if state is None:
            local.seen = local.version  # nothing newer exists
            return
        local.jar = CookieJar()
        for cookie in state.cookies:
            local.jar.set_cookie(cookie)
        local.version = local.seen = state.version
        self._inc("cookies_shared/refreshed")
        if state.malformed:
            logger.error("skipped %d malformed cookies in %s", state.malformed, local.key)
            self._inc("cookies_shared/malformed", state.malformed)

    def _change(self, local: LocalJar, change: Callable[[], None]) -> None:
        """Apply ``change`` to the copy, then store what it changed in one round trip."""
        before = {cookie_field(c): encode_cookie(c) for c in local.jar}
        change()
        after = local.snapshot()
        for name, value in after.items():
            if before.get(name) != value:
                local.pending[name] = value
        for name in before.keys() - after.keys():
            local.pending[name] = None  # deleted by the site, or expired
        self._flush(local)

    def _flush(self, local: LocalJar) -> None:
        if not local.pending or self.store is None:
            return
        store = {k: v for k, v in local.pending.items() if v is not None}
        delete = [k for k, v in local.pending.items() if v is None]
        write = partial(self.store.write, local.key, store, delete)
        try:
            version, previous = retried(self.repairer, write) if self.repairer else write()
        except connection.REFUSED_OR_TRANSIENT as exc:
            connection.warn_away(logger, "shared cookies not stored, will retry: %s", exc)
            self._inc("cookies_shared/write_errors")
            return
        local.pending.clear()
        if previous == local.version:  # no other change in between: the copy is current
            local.version = version
        local.seen = max(local.seen, version)
        self._inc("cookies_shared/stored", len(store) + len(delete))

    def _inc(self, key: str, count: int = 1) -> None:
        stats = getattr(getattr(self, "crawler", None), "stats", None)
        if stats is not None:
            stats.inc_value(key, count)


def check_installed(settings: Any) -> None:
    """With ``COOKIES_SHARED``, the middleware must be installed: say how, or nothing is shared."""
    if not setting(settings, "COOKIES_SHARED") or not settings.getbool("COOKIES_ENABLED"):
        return
    paths = build_component_list(settings.getwithbase("DOWNLOADER_MIDDLEWARES"))
    classes = [load_object(path) if isinstance(path, str) else path for path in paths]
    if not any(isinstance(c, type) and issubclass(c, SharedCookiesMiddleware) for c in classes):
        raise ConfigError(
            "COOKIES_SHARED is on, but SharedCookiesMiddleware is not installed: add"
            f" DOWNLOADER_MIDDLEWARES = {{{SCRAPY_MIDDLEWARE!r}: None,"
            " 'celery_crawl.cookies.SharedCookiesMiddleware': 700}"
        )
