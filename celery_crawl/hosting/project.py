"""The Scrapy project as the Celery side sees it: settings, spiders, seeds.

Settings are the Scrapy project's settings module, overlaid with what the
hosted crawlers need (shared scheduler, stats, job middlewares) and with
``REDIS_URL`` and ``CELERY_CRAWL_KEY_PREFIX`` from the environment.

A spider turns a seed into requests with ``requests_from_seed(seed)``; a
spider without it takes ``{"url": ...}`` seeds. This runs in the caller's
process, so bad seeds fail at ``crawl()`` time with a clear error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.settings import Settings
from scrapy.spiderloader import SpiderLoader
from scrapy.utils.misc import build_from_crawler, load_object

from celery_crawl.codec.serializer import codec_from_settings
from celery_crawl.core import connection
from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import BadSeed, ConfigError, EncodeError, UnknownSpider, cut, quote
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.dupefilter.filters import RFPDupeFilter
from celery_crawl.hosting.spiders import RedisMixin
from celery_crawl.jobs.limits import from_settings as limits_from_settings
from celery_crawl.jobs.signals import JOB_ARGS_META, JOB_DEPTH_META, JOB_META, JOB_PRIORITY_META
from celery_crawl.producer.schedule import Schedule
from celery_crawl.queue.queues import Base
from celery_crawl.scheduler.components import Components

SpiderOrCrawler = str | Crawler  # a spider's name, or a crawler of it made once per crawl()
MAX_START_REQUESTS = 100_000  # start() requests one job takes; more is a job for a RedisSpider
HOSTED_SETTINGS: dict[str, Any] = {
    "SCHEDULER": "celery_crawl.scheduler.Scheduler",
    "STATS_CLASS": "celery_crawl.stats.RedisStatsCollector",
    # hosted crawlers share the queue: never delete it when one stops
    "SCHEDULER_PERSIST": True,
    # a job's requests run in whichever process leases them: no crawl-wide start requests
    "SCHEDULER_START_REQUESTS": "every",
    # CLOSESPIDER_* are each job's own limits (celery_crawl.jobs.limits.LIMITS), not the crawler's
    "CLOSESPIDER_SCOPE": "job",
    "TELNETCONSOLE_ENABLED": False,
    "REMOTE_CONTROL_ENABLED": False,
}
# added to Scrapy's *_BASE dicts, so a spider's own custom_settings
# (DOWNLOADER_MIDDLEWARES = {...}) cannot drop them
HOSTED_MIDDLEWARES: dict[str, dict[str, int | None]] = {
    "SPIDER_MIDDLEWARES_BASE": {
        "celery_crawl.middleware.JobSpiderMiddleware": 1,
        # log lines name their spider and job (celery_crawl.jobs.logcontext)
        "celery_crawl.logcontext.LogContextSpiderMiddleware": 0,
        "celery_crawl.middleware.HostedStartMiddleware": 2,
        # DEPTH_LIMIT is the default of each job's own depth limit
        "scrapy.spidermiddlewares.depth.DepthMiddleware": None,
        "celery_crawl.middleware.JobDepthMiddleware": 900,
    },
    "EXTENSIONS_BASE": {
        # CLOSESPIDER_* are per job limits when hosted (celery_crawl.jobs.limits.LIMITS): the
        # extension would close the crawler that every job of the spider shares
        "scrapy.extensions.closespider.CloseSpider": None,
        # FEEDS with %(job)s: a file per job, stored when the job ends
        "scrapy.extensions.feedexport.FeedExporter": None,
        "celery_crawl.feeds.JobFeedExporter": 0,
        "celery_crawl.logcontext.LogContextExtension": 0,
    },
    "DOWNLOADER_MIDDLEWARES_BASE": {
        "celery_crawl.logcontext.LogContextDownloaderMiddleware": 0,
        "celery_crawl.middleware.JobDownloaderMiddleware": 950,
        # per-site pauses and back-offs, shared by every process (celery_crawl.politeness.sites)
        "celery_crawl.politeness.SiteLimitsMiddleware": 800,
        # with ROBOTSTXT_OBEY: robots.txt fetched once for every process, its Crawl-delay shared
        "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
        "celery_crawl.politeness.SharedRobotsTxtMiddleware": 100,
        # Scrapy's, unless the spider sets COOKIES_SHARED: then its jars are shared
        "scrapy.downloadermiddlewares.cookies.CookiesMiddleware": None,
        "celery_crawl.cookies.SharedCookiesMiddleware": 700,
    },
}
# settings always taken from the environment when set there (marked env in
# celery_crawl.core.defaults); a project adds its own with CELERY_CRAWL_ENV = [...]
ENVIRONMENT = tuple(name for name, entry in SETTINGS.items() if entry.env)


def load_settings(module: str | None, overrides: dict[str, Any] | None = None) -> Settings:
    """The settings module, the hosting defaults, the environment, then ``overrides``."""
    settings = Settings()
    if module:
        settings.setmodule(module, priority="project")
    settings.update(HOSTED_SETTINGS, priority="project")
    for name, components in HOSTED_MIDDLEWARES.items():
        merged = {**settings.getdict(name), **components}
        settings.set(name, merged, priority="project")
    for name in (*ENVIRONMENT, *setting(settings, "CELERY_CRAWL_ENV")):
        if os.environ.get(name):
            settings.set(name, os.environ[name], priority="cmdline")
    settings.update(overrides or {}, priority="cmdline")  # the caller's own word wins
    return settings


class Project:
    """Spiders, settings and the seed → request step, for one settings module."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loader = SpiderLoader.from_settings(settings)
        self.codec = codec_from_settings(settings)

    @classmethod
    def from_module(cls, module: str | None, overrides: dict[str, Any] | None = None) -> Project:
        return cls(load_settings(module, overrides))

    @property
    def client(self) -> Any:
        return connection.from_settings(self.settings)

    def spider_names(self) -> list[str]:
        return sorted(self.loader.list())

    def spider_class(self, name: str) -> type[Spider]:
        try:
            return self.loader.load(name)
        except KeyError:
            known = ", ".join(self.spider_names()) or "none"
            raise UnknownSpider(f"unknown spider {name!r}; this project has: {known}") from None

    def crawler(self, spider: SpiderOrCrawler) -> Crawler:
        """A crawler of ``spider`` on the project's settings, or ``spider`` if it is one.

        The methods that need a spider's settings (its ``custom_settings``
        included) take its name or a crawler: one ``crawl()`` builds the crawler
        once (:func:`celery_crawl.app.client.crawl`) and passes it to each.
        """
        if isinstance(spider, Crawler):
            return spider
        return Crawler(self.spider_class(spider), self.settings)

    def components(self, spider: SpiderOrCrawler) -> Components:
        """The factory of ``spider``'s queues and dedup filters, on the project's client."""
        return Components(self.crawler(spider).settings, self.client)

    def spider_settings(self, spider: SpiderOrCrawler) -> Settings:
        """The settings as ``spider`` sees them: the project's, with its ``custom_settings``."""
        return self.crawler(spider).settings

    def hosted_spiders(self) -> list[str]:
        """``CELERY_CRAWL_SPIDERS``: the spiders a worker may host (default: all of them)."""
        return list(setting(self.settings, "CELERY_CRAWL_SPIDERS")) or self.spider_names()

    def check_hostable(self, spider: str) -> None:
        """Refuse a job that no worker may run: unknown, or excluded by ``CELERY_CRAWL_SPIDERS``."""
        self.spider_class(spider)
        hosted = self.hosted_spiders()
        if spider not in hosted:
            raise ConfigError(
                f"no worker may host spider {spider!r}: CELERY_CRAWL_SPIDERS lists only"
                f" {', '.join(hosted)}; add it there to run its jobs"
            )

    @property
    def prefix(self) -> str:
        """``CELERY_CRAWL_KEY_PREFIX``: what every key of this project starts with."""
        return str(setting(self.settings, "CELERY_CRAWL_KEY_PREFIX"))

    def celery_queues(self) -> dict[str, str]:
        """``CELERY_CRAWL_QUEUES``: the Celery queue of each spider (others use the default)."""
        queues = setting(self.settings, "CELERY_CRAWL_QUEUES")
        return {str(k): str(v) for k, v in queues.items()}

    def keys(self, spider: SpiderOrCrawler) -> SpiderKeys:
        """The spider's keys, as its scheduler names them (its ``custom_settings`` included)."""
        crawler = self.crawler(spider)
        return self.components(crawler).keys(crawler.spidercls.name)

    def job_spans(self, spider: SpiderOrCrawler) -> list[SpiderKeys]:
        """The spiders a job of ``spider`` may span: its whole group."""
        crawler = self.crawler(spider)
        return self.components(crawler).group(crawler.spidercls.name)

    def queue(self, spider: SpiderOrCrawler) -> Base:
        """The spider's queue, built as its scheduler builds it (``scheduler.components``)."""
        crawler = self.crawler(spider)
        return self.components(crawler).queue(crawler.spidercls.name)

    def dupefilter(self, spider: SpiderOrCrawler) -> RFPDupeFilter:
        """The spider's shared filter (``DUPEFILTER_CLASS``), to inspect or reset it."""
        crawler = self.crawler(spider)
        return self.components(crawler).dupefilter(crawler.spidercls.name)

    def schedule(self, spider: SpiderOrCrawler) -> Schedule:
        """The spider's sources on their own schedules (``producer.schedule``)."""
        crawler = self.crawler(spider)
        return self.components(crawler).schedule(crawler.spidercls.name)

    def dedup_scope(self, spider: SpiderOrCrawler) -> str:
        """``DUPEFILTER_SCOPE`` as the spider sees it (its own settings included)."""
        settings = self.spider_settings(spider)
        return str(setting(settings, "DUPEFILTER_SCOPE"))

    def job_keep(self, spider: SpiderOrCrawler) -> float:
        """Seconds a finished job of ``spider`` stays: ``CELERY_CRAWL_JOB_KEEP_SECONDS``."""
        keep = float(setting(self.spider_settings(spider), "CELERY_CRAWL_JOB_KEEP_SECONDS"))
        if keep < 1:
            raise ConfigError(f"CELERY_CRAWL_JOB_KEEP_SECONDS is {keep}: it must be 1 s or more")
        return keep

    def job_limits(
        self, spider: SpiderOrCrawler, limits: dict[str, float] | None
    ) -> dict[str, float]:
        """A job's limits: the spider's ``CLOSESPIDER_*`` settings, then ``limits`` over them."""
        settings = self.spider_settings(spider)
        found = limits_from_settings(settings)
        found.update(limits or {})
        return {name: value for name, value in found.items() if value}

    def seed_entries(
        self,
        spider: SpiderOrCrawler,
        seeds: Sequence[Any],
        job_id: str,
        priority: int,
        args: dict[str, str] | None = None,
        *,
        queue: Base | None = None,
    ) -> list[Entry]:
        """The seed requests of a job, as entries of ``queue`` (by default the spider's
        :meth:`queue`); raises :class:`BadSeed` on bad input.

        No seeds: the requests of the spider's ``start()`` (its ``start_urls``).
        """
        crawler = self.crawler(spider)
        spidercls = crawler.spidercls
        instance = spidercls.from_crawler(crawler, **(args or {}))  # as `scrapy crawl -a` does
        fingerprinter = build_from_crawler(
            load_object(crawler.settings["REQUEST_FINGERPRINTER_CLASS"]), crawler
        )
        queue = queue if queue is not None else self.queue(crawler)
        made = [r for seed in seeds for r in seed_requests(instance, seed)]
        requests = made if seeds else start_requests_of(instance)
        entries = []
        for request in requests:
            request.meta.pop(JOB_ARGS_META, None)  # the job's hash holds them, once
            request.meta.pop(JOB_DEPTH_META, None)
            request.meta[JOB_META] = job_id
            request.meta[JOB_PRIORITY_META] = priority
            request.priority += priority
            entries.append(self._entry(instance, request, fingerprinter, job_id, queue))
        return entries

    def _entry(
        self, spider: Spider, request: Request, fingerprinter: Any, job: str, queue: Base
    ) -> Entry:
        try:
            payload = self.codec.encode(request, spider)
            fingerprint = None if request.dont_filter else bytes(fingerprinter.fingerprint(request))
            return queue.entry(request, payload, fingerprint, job)
        except (EncodeError, ConfigError) as exc:
            what = f"seed request {cut(str(request))}"
            raise BadSeed(f"{what} cannot be queued: {cut(str(exc))}") from exc


def project_of(app: Any) -> Project:
    """The Scrapy project of a Celery app made by ``create_app``, loaded once per app."""
    project = getattr(app, "celery_crawl_project", None)
    if project is None:
        overrides = getattr(app, "celery_crawl_overrides", None)
        project = Project.from_module(app.conf.get("celery_crawl_settings"), overrides)
        app.celery_crawl_project = project
    return project


def parse_seed(spidercls: type[Spider], text: str) -> Any:
    """A seed typed on a command line: JSON, or a bare value for the spider's ``seed_key``."""
    if text.startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise BadSeed(f"seed {quote(text)} is not valid JSON: {exc}") from exc
    key = getattr(spidercls, "seed_key", None)
    if key:
        return {key: text}
    return {"url": text}


def start_requests_of(spider: Spider) -> list[Request]:
    """The requests ``spider.start()`` yields, gathered here, with no reactor running.

    ``start()`` is driven step by step: one that waits for I/O (which needs the
    engine), or never ends, cannot seed a job; nor can a RedisSpider's, which
    reads Redis for as long as it runs. Items it yields are skipped.
    """
    if isinstance(spider, RedisMixin):
        raise BadSeed(
            f"spider {spider.name!r} reads its start URLs from Redis: push them to"
            f" {spider.start_urls_source.key!r}, or give the job seeds"
        )
    steps = spider.start()
    requests: list[Request] = []
    while len(requests) <= MAX_START_REQUESTS:
        step: Any = steps.__anext__()  # a coroutine-like step: send() runs it
        try:
            step.send(None)
        except StopIteration as yielded:
            if isinstance(yielded.value, Request):
                requests.append(yielded.value)
            continue
        except StopAsyncIteration:
            break
        except Exception as exc:
            raise BadSeed(
                f"spider {spider.name!r}: start() cannot run outside the engine ({exc!r});"
                " give the job seeds"
            ) from exc
        step.close()
        raise BadSeed(f"spider {spider.name!r}: start() waits for I/O; give the job seeds")
    else:
        raise BadSeed(
            f"spider {spider.name!r}: start() yields more than {MAX_START_REQUESTS:,} requests;"
            " give the job seeds, or feed a RedisSpider's start key"
        )
    if not requests:
        raise BadSeed(f"spider {spider.name!r}: start() yields no request; give the job seeds")
    return requests


def seed_requests(spider: Spider, seed: Any) -> list[Request]:
    """What ``spider`` makes of ``seed``, checked."""
    make = getattr(spider, "requests_from_seed", None)
    try:
        made: Iterable[Any] = make(seed) if make else [default_seed_request(seed)]
        requests = list(made)
    except BadSeed:
        raise
    except Exception as exc:
        raise BadSeed(
            f"spider {spider.name!r} cannot use seed {quote(seed)}: {cut(str(exc))}"
        ) from exc
    if not requests or not all(isinstance(r, Request) for r in requests):
        raise BadSeed(f"spider {spider.name!r} made no requests from seed {quote(seed)}")
    return requests


def default_seed_request(seed: Any) -> Request:
    url = seed.get("url") if isinstance(seed, dict) else seed
    if not isinstance(url, str):
        raise BadSeed(f"seed {quote(seed)} is not a URL or {{'url': ...}}")
    return Request(url, dont_filter=True)


def check_settings(settings: Settings) -> None:
    if not settings.getlist("SPIDER_MODULES"):
        raise ConfigError("SPIDER_MODULES is empty: the workers would host no spider")
