"""Every setting celery_crawl defines or interprets, with its default and meaning.

This module is the one home of the defaults. A component reads a setting with
:func:`setting`, never with a default of its own::

    from celery_crawl.core.defaults import setting

    lease_seconds = setting(crawler.settings, "SCHEDULER_LEASE_SECONDS")  # a float

The value is typed after the default (Scrapy's ``getbool``, ``getint``,
``getfloat``, ``getlist``, ``getdict`` or ``get``), so settings taken from the
environment as strings (``"false"``, ``"0.5"``, ``"a,b"``, JSON for a dict)
come back typed, and the registry's default applies whenever the settings do
not set the name: under the hosted settings of ``create_app`` and in a plain
``scrapy crawl`` alike. A name missing here raises :class:`KeyError`.

The settings reference ``docs/settings.md`` is generated from :data:`SETTINGS`::

    python -m celery_crawl.core.defaults --write

This module sits at the bottom layer, beside ``errors`` and ``keys``: it
imports neither Scrapy, Celery nor redis at import time.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, NoneType
from typing import Any

REDIS = "Redis"
KEYS = "Redis keys"
SCHEDULER = "Scheduler and queue"
DEDUP = "Dedup"
STATS = "Stats"
HOSTING = "Jobs and hosting"
PRODUCER = "Producer"
SPIDERS = "Start URLs and items (scrapy-redis spiders and pipeline)"
COOKIES = "Shared cookies"
POLITENESS = "Per-site politeness (shared by every worker)"
BROWSER = "Browsers (scrapy-playwright, docs/browsers.md)"
ENVIRONMENT = "Environment variables"
SECTIONS = (
    REDIS,
    KEYS,
    SCHEDULER,
    DEDUP,
    STATS,
    HOSTING,
    PRODUCER,
    SPIDERS,
    COOKIES,
    POLITENESS,
    BROWSER,
    ENVIRONMENT,
)

# the server a client talks to when neither the settings nor the environment name one
FALLBACK_REDIS_URL = "redis://localhost:6379/0"

_TYPES: tuple[type, ...] = (bool, int, float, str, list, dict)


@dataclass(frozen=True)
class Setting:
    """One setting: its default, the type its value is read as, and what it means.

    ``type`` is derived from the default, and must be given when the default
    is None. A list default is stored as a tuple and a dict default as a
    read-only mapping, so that nobody changes the registry by accident;
    :func:`setting` hands out copies. ``env``: hosted crawlers take the value
    from the environment variable of the same name when it is set there. The
    entries of the section :data:`ENVIRONMENT` are environment variables only,
    not Scrapy settings.
    """

    name: str
    default: Any
    meaning: str
    section: str
    type: type = NoneType  # derived from the default
    env: bool = False

    def __post_init__(self) -> None:
        default = self.default
        if isinstance(default, list | tuple):
            object.__setattr__(self, "default", tuple(default))
        elif isinstance(default, Mapping):
            object.__setattr__(self, "default", MappingProxyType(dict(default)))
        if self.type is NoneType:
            object.__setattr__(self, "type", _type_of(self.name, self.default))
        self._check()

    def _check(self) -> None:
        if not (self.name.isupper() and self.name.isidentifier()):
            raise ValueError(f"setting name {self.name!r} must be UPPER_CASE")
        if self.type not in _TYPES:
            raise ValueError(f"{self.name}: type {self.type.__name__} is not one of {_TYPES}")
        if self.default is not None and _type_of(self.name, self.default) is not self.type:
            raise ValueError(f"{self.name}: default {self.default!r} is not a {self.type.__name__}")
        if self.section not in SECTIONS:
            raise ValueError(f"{self.name}: unknown section {self.section!r}")
        if not self.meaning or "\n" in self.meaning or "|" in self.meaning:
            raise ValueError(f"{self.name}: the meaning must be one line, without '|'")
        if self.env and not self.scrapy:
            raise ValueError(f"{self.name}: an environment variable is not also a setting")

    @property
    def scrapy(self) -> bool:
        """Whether this is a Scrapy setting, as opposed to an environment variable only."""
        return self.section != ENVIRONMENT


def _type_of(name: str, default: Any) -> type:
    if default is None:
        raise ValueError(f"{name}: give a type, the default None does not tell it")
    if isinstance(default, tuple):
        return list
    if isinstance(default, Mapping):
        return dict
    return type(default)


_KEY_TEMPLATE = "; `%(spider)s` is required, and becomes the hash tag `{spider}`"

_ENTRIES = (
    # -- Redis ---------------------------------------------------------------
    Setting(
        "REDIS_URL",
        None,
        "the Redis of the crawl state: `redis://`, `rediss://`, `unix://`, `redis+cluster://`,"
        " `redis+sentinel://` (and `rediss+` forms). Unset: `redis://REDIS_HOST:REDIS_PORT/0`"
        " when `REDIS_HOST` is set, else the `REDIS_URL` environment variable, else"
        f" `{FALLBACK_REDIS_URL}`",
        REDIS,
        str,
        env=True,
    ),
    Setting(
        "REDIS_HOST", None, "scrapy-redis style: the host, when `REDIS_URL` is unset", REDIS, str
    ),
    Setting("REDIS_PORT", 6379, "scrapy-redis style: the port that goes with `REDIS_HOST`", REDIS),
    Setting("REDIS_DB", 0, "scrapy-redis style: the database that goes with `REDIS_HOST`", REDIS),
    Setting(
        "REDIS_DECODE_RESPONSES",
        False,
        "scrapy-redis's client option; must stay false (queue entries are bytes): true is refused",
        REDIS,
    ),
    Setting(
        "REDIS_PARAMS",
        {"socket_connect_timeout": 5, "socket_timeout": 30, "health_check_interval": 30},
        "keyword arguments for the Redis client, merged over the default ones (TLS: `ssl_ca_certs`,"
        " `ssl_certfile`, `ssl_keyfile`...); scrapy-redis's `redis_cls` is ignored",
        REDIS,
    ),
    Setting(
        "CELERY_CRAWL_ALLOW_EVICTION",
        False,
        "accept a Redis whose `maxmemory-policy` evicts keys (anything but `noeviction`): a"
        " scheduler then opens with a warning instead of refusing. Evicted crawl keys are lost"
        " for good (a job's hash, queued requests)",
        REDIS,
    ),
    # -- Redis keys ----------------------------------------------------------
    Setting(
        "CELERY_CRAWL_KEY_PREFIX",
        "celery_crawl",
        "the start of every Redis key, to keep several projects apart on one Redis",
        KEYS,
        env=True,
    ),
    Setting(
        "SCHEDULER_QUEUE_KEY",
        "%(prefix)s:%(spider)s:queue",
        "key template of a spider's request queue" + _KEY_TEMPLATE,
        KEYS,
    ),
    Setting(
        "SCHEDULER_DUPEFILTER_KEY",
        "%(prefix)s:%(spider)s:dupefilter",
        "key template of a spider's dedup filter" + _KEY_TEMPLATE,
        KEYS,
    ),
    Setting(
        "STATS_KEY",
        "%(prefix)s:%(spider)s:stats",
        "key template of a spider's shared stats" + _KEY_TEMPLATE,
        KEYS,
    ),
    Setting(
        "SCHEDULER_DEADLETTER_KEY",
        "%(prefix)s:%(spider)s:deadletter",
        "key template of a spider's dead-letter list" + _KEY_TEMPLATE,
        KEYS,
    ),
    Setting(
        "CELERY_CRAWL_SPIDER_GROUPS",
        {},
        "spider → group. A group's spiders share one hash tag and one job hash, so a job can span"
        " them and requests can be routed between them"
        " (`celery_crawl.scheduler.routing.to_spider`); they must use the same dupefilter and"
        " queue class",
        KEYS,
    ),
    # -- Scheduler and queue -------------------------------------------------
    Setting(
        "SCHEDULER_QUEUE_CLASS",
        "celery_crawl.queue.PriorityQueue",
        "the queue, of `celery_crawl.queue.queues`: `PriorityQueue` (priorities, FIFO within one),"
        " `LifoPriorityQueue` (priorities, LIFO within one: Scrapy's own default order),"
        " `FifoQueue` or `LifoQueue` (priority ignored); the scrapy-redis paths mean the same",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_SERIALIZER",
        "msgpack",
        "how queued requests are encoded: `msgpack` or `json`, which keep the types of meta and"
        " cb_kwargs without pickle, or `signed_pickle` (`scrapy_redis.picklecompat` means it),"
        " which needs `SCHEDULER_PICKLE_SECRET`. docs/requests.md compares them",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_ALLOWED_MODULES",
        [],
        "modules and packages whose enums, Items, dataclasses and attrs classes may travel in"
        " meta and cb_kwargs, besides the package of each module of `SPIDER_MODULES` and the"
        " spider's own module's package (the module itself when in none: `scrapy runspider`)",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_ALLOWED_SCHEMES",
        ["http", "https"],
        "the URL schemes a request read back from the queue may use; any other (`file`, `data`,"
        " `ftp`, `s3`...) is dead-lettered as `refused_scheme` and never fetched",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_ALLOWED_METHODS",
        ["GET", "HEAD", "POST"],
        "the HTTP methods a request read back from the queue may use (Scrapy's links, robots.txt,"
        ' sitemaps and forms); any other is dead-lettered as `refused_method`. `["GET", "HEAD"]`'
        " for a crawl that posts no form",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_PICKLE_SECRET",
        None,
        "`signed_pickle`: the secret (16 bytes or more) that signs every queue entry; the same in"
        " every process of the crawl. Also read from the environment variable of the same name",
        SCHEDULER,
        str,
        env=True,
    ),
    Setting(
        "SCHEDULER_PERSIST",
        False,
        "keep the queue and the dedup filter when the spider closes; when false they are deleted"
        " by the last process of the spider to close (processes killed without closing stop"
        " counting after 3 heartbeats, at least 30 s), and the next crawl starts with fresh shared"
        " stats. Hosted crawlers set it to true",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_START_REQUESTS",
        "once",
        "`once`: the processes open together make one crawl, and only one of them runs the"
        " spider's start requests while the others wait until they are queued (a spider class"
        " that sets `start_in_every_process`, as RedisSpider does to read its start key, runs"
        " them in every process); `every`: each process runs them, as before."
        " Hosted crawlers set `every` (their start requests run as jobs)",
        SCHEDULER,
    ),
    Setting(
        "CLOSESPIDER_SCOPE",
        "crawl",
        "`crawl`: `CLOSESPIDER_PAGECOUNT`, `_ITEMCOUNT`, `_ERRORCOUNT` and `_TIMEOUT` hold for"
        " the whole crawl, every process counted (a count limit may be passed by the requests"
        " downloading when it is reached: up to `CONCURRENT_REQUESTS` per process); `process`:"
        " each process counts its own, as Scrapy's extension alone does. Hosted crawlers set"
        " `job`: the limits are each job's own",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_FLUSH_ON_START",
        False,
        "delete the queue and the dedup filter when the spider opens",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_IDLE_BEFORE_CLOSE",
        0.0,
        "seconds the spider stays open once nothing is queued or leased anywhere, waiting for work"
        " from other processes (while any process holds a lease, every process stays open)",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_LEASE_SECONDS",
        10.0,
        "seconds a leased request stays with its process without a heartbeat; a live process"
        " renews its leases from a thread of its own (every third of this, at most every"
        " SCHEDULER_REQUEUE_INTERVAL), so only a dead or frozen process loses them, and its"
        " requests are back in the queue within this plus one heartbeat",
        SCHEDULER,
    ),
    Setting("SCHEDULER_PREFETCH", 16, "requests leased per round trip", SCHEDULER),
    Setting(
        "SCHEDULER_FLUSH_DELAY",
        0.01,
        "seconds new requests and acks wait in the buffer, so that several reach Redis in one"
        " round trip",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_BATCH_SIZE", 500, "buffered requests that force an immediate write", SCHEDULER
    ),
    Setting(
        "SCHEDULER_REQUEUE_INTERVAL",
        5.0,
        "seconds between heartbeats: lease renewals and checks for expired leases (at most a"
        " third of the lease time)",
        SCHEDULER,
    ),
    Setting(
        "SCHEDULER_DEADLETTER_MAX",
        10_000,
        "records kept in the dead-letter list: entries that cannot be decoded, and requests that"
        " could not be queued",
        SCHEDULER,
    ),
    Setting(
        "CELERY_CRAWL_ACK_REPLICAS",
        0,
        "replicas that must hold an ack before the scheduler moves on (`WAIT`, pipelined with the"
        " acking script); 0 waits for none. Not on a Redis Cluster",
        SCHEDULER,
    ),
    Setting("CELERY_CRAWL_ACK_TIMEOUT", 1.0, "seconds an ack waits for those replicas", SCHEDULER),
    # -- Dedup ---------------------------------------------------------------
    Setting(
        "DUPEFILTER_CLASS",
        "celery_crawl.dupefilter.RFPDupeFilter",
        "the shared dedup filter: `RFPDupeFilter` (exact), `BloomDupeFilter`,"
        " `ExpiringDupeFilter` or `HitExpiringDupeFilter` of `celery_crawl.dupefilter`."
        " Scrapy's default and the scrapy-redis path mean the exact one. Fingerprints come"
        " from Scrapy's `REQUEST_FINGERPRINTER_CLASS`",
        DEDUP,
    ),
    Setting(
        "SCHEDULER_DUPEFILTER_CLASS",
        "",
        "in scrapy-redis's defaults but never read by it: set `DUPEFILTER_CLASS`. A value other"
        " than `DUPEFILTER_CLASS`'s is refused",
        DEDUP,
    ),
    Setting(
        "DUPEFILTER_SCOPE",
        "job",
        "whose filter a job's requests meet. job: the job's own (an exact set, deleted when the"
        " job ends), so running a job again crawls again, and two jobs on one seed both crawl"
        " fully. spider: DUPEFILTER_CLASS's, shared by every job of the spider, for incremental"
        " crawls across jobs (set it in the spider's custom_settings). Requests of no job always"
        " meet the spider's",
        DEDUP,
    ),
    Setting(
        "DUPEFILTER_BLOOM_CAPACITY",
        1_000_000,
        "bloom filter: fingerprints the first sub-filter holds at its rate; past it, a sub-filter"
        " twice as large is added",
        DEDUP,
    ),
    Setting(
        "DUPEFILTER_BLOOM_ERROR_RATE",
        0.001,
        "bloom filter: the false-positive rate it stays below, however far it grows",
        DEDUP,
    ),
    Setting(
        "DUPEFILTER_EXPIRE_SECONDS",
        86_400.0,
        "expiring filter: a fingerprint is forgotten this many seconds after it was added (at"
        " most one bucket later)",
        DEDUP,
    ),
    Setting(
        "DUPEFILTER_EXPIRE_BUCKETS",
        24,
        "expiring filter: time buckets per window; memory is freed a bucket at a time",
        DEDUP,
    ),
    Setting(
        "DUPEFILTER_EXPIRE_CRAWLS",
        5,
        "hit-expiring filter: a fingerprint is forgotten once this many crawls of its source in"
        " a row did not link to it (a crawl: a job, with `DUPEFILTER_SCOPE = 'spider'`)",
        DEDUP,
    ),
    # -- Stats ---------------------------------------------------------------
    Setting(
        "STATS_FLUSH_INTERVAL", 1.0, "seconds between writes of the buffered stats changes", STATS
    ),
    Setting("STATS_FLUSH_MAX_OPS", 1000, "buffered stats changes that force a write", STATS),
    # -- Jobs and hosting ----------------------------------------------------
    Setting(
        "CELERY_CRAWL_SPIDERS",
        [],
        "the spiders a worker hosts; empty: every spider of `SPIDER_MODULES`",
        HOSTING,
    ),
    Setting(
        "CELERY_CRAWL_QUEUES",
        {},
        "spider → Celery queue of its job and producer tasks. A worker hosts only the spiders of"
        " the queues it consumes (`-Q`); spiders not listed use the default queue",
        HOSTING,
    ),
    Setting(
        "CELERY_CRAWL_PROGRESS_INTERVAL",
        1.0,
        "seconds between progress reports of a job task",
        HOSTING,
    ),
    Setting(
        "CELERY_CRAWL_JOB_TRACKERS",
        100,
        "job tasks a worker runs at once in threads beside its pool, so that no job holds a pool"
        " slot; up to 10 times as many wait for a thread without holding a prefetch slot",
        HOSTING,
    ),
    Setting(
        "CELERY_CRAWL_JOB_KEEP_SECONDS",
        7 * 24 * 3600.0,
        "seconds a finished job stays readable: its hash (state, counters, stats), its entry in"
        " the job index and, unless the Celery app sets `result_expires`, its task's result",
        HOSTING,
    ),
    Setting(
        "CELERY_CRAWL_HEARTBEAT_SECONDS",
        5.0,
        "seconds between a worker process's heartbeats in the worker registry; it counts as"
        " live until it has missed three (status, the exporter and waiting jobs read it)",
        HOSTING,
    ),
    Setting(
        "CELERY_CRAWL_OPEN_REDIS_WAIT_SECONDS",
        60.0,
        "seconds a worker process whose crawlers are about to open waits for a Redis that"
        " cannot be reached or refuses writes for memory, trying again with a backoff (1 s"
        " doubling to 10 s) and a WARNING per try, before the worker stops; 0 stops it at"
        " once. A configuration error stops it at once. Prefork workers raise Celery's"
        " worker_proc_alive_timeout to this plus 90 s, as a child opens before it is up",
        HOSTING,
    ),
    Setting(
        "CELERY_CRAWL_GC_FREEZE",
        True,
        "freeze the process's startup heap out of the cyclic GC once the crawlers are open."
        " Objects made later are collected as usual; startup objects that become garbage later"
        " are never freed",
        HOSTING,
    ),
    Setting(
        "CELERY_CRAWL_GC_THRESHOLD",
        [5000, 20, 10],
        "the cyclic GC's thresholds (gc.set_threshold) once the crawlers are open: 1 to 3"
        " positive integers, or empty to keep Python's (700, 10, 10). A crawl makes many"
        " short-lived containers; fewer, larger young collections halved the GC's time in the"
        " end-to-end benchmark, at the same peak memory",
        HOSTING,
    ),
    Setting(
        "CELERY_CRAWL_ENV",
        [],
        "more settings that hosted crawlers take from the environment when set there",
        HOSTING,
    ),
    # -- Producer ------------------------------------------------------------
    Setting(
        "PRODUCER_SPIDERS", [], "spiders that get a Celery beat entry for the producer", PRODUCER
    ),
    Setting(
        "PRODUCER_SOURCES",
        [],
        "one job per source, made into a seed as on the command line; the Redis set"
        " `<prefix>:{spider}:producer:sources` wins when it exists",
        PRODUCER,
    ),
    Setting(
        "PRODUCER_SOURCES_FILE",
        "",
        "a YAML, TOML or JSON file of sources (docs/producer.md) that each producer tick syncs"
        " into the schedule of its spider when the file has changed, as `celery-crawl sources"
        " import --sync` would; a spider the file does not name is left as it is",
        PRODUCER,
        env=True,
    ),
    Setting("PRODUCER_PERIOD", 60.0, "seconds between producer ticks", PRODUCER),
    Setting("PRODUCER_JOB_CAP", 10, "most produced jobs queued or running at once", PRODUCER),
    Setting(
        "PRODUCER_QUEUE_CAP",
        100_000,
        "produce nothing while the queues of the spider's group hold this many requests",
        PRODUCER,
    ),
    Setting(
        "PRODUCER_LIMITS",
        {},
        "limits of every produced job, as crawl(limits=...) takes them: pages, items, seconds,"
        " errors, depth (unset: the spider's CLOSESPIDER_* and DEPTH_LIMIT settings)",
        PRODUCER,
    ),
    Setting(
        "PRODUCER_ARGS",
        {},
        "spider arguments of every produced job, as crawl(args=...) and -a take them",
        PRODUCER,
    ),
    Setting(
        "PRODUCER_ADAPTIVE_FASTER",
        0.8,
        "an adaptive source's interval is multiplied by this after a job that found items"
        " (0 to 1; Nutch's AdaptiveFetchSchedule takes 0.8)",
        PRODUCER,
    ),
    Setting(
        "PRODUCER_ADAPTIVE_SLOWER",
        1.4,
        "an adaptive source's interval is multiplied by this after a job that found no item"
        " (1 or more; Nutch takes 1.4)",
        PRODUCER,
    ),
    # -- Start URLs and items ------------------------------------------------
    Setting(
        "REDIS_START_URLS_KEY",
        "%(prefix)s:%(name)s:start_urls",
        "key template of the start URLs a `celery_crawl.spiders.RedisSpider` reads; `%(name)s`"
        " (or `%(spider)s`) becomes the hash tag `{name}`, a key without it is used as is",
        SPIDERS,
    ),
    Setting(
        "REDIS_START_URLS_AS_SET",
        False,
        "the start key is a set (`SPOP`) instead of a list (`LPOP`)",
        SPIDERS,
    ),
    Setting(
        "REDIS_START_URLS_AS_ZSET",
        False,
        "the start key is a sorted set, highest score first (`ZPOPMAX`)",
        SPIDERS,
    ),
    Setting(
        "REDIS_START_URLS_BATCH_SIZE",
        0,
        "start URLs popped per round trip; 0: `CONCURRENT_REQUESTS`, as scrapy-redis does",
        SPIDERS,
    ),
    Setting(
        "REDIS_ENCODING",
        "utf-8",
        "the encoding of the start URLs and data in the start key",
        SPIDERS,
    ),
    Setting(
        "MAX_IDLE_TIME_BEFORE_CLOSE",
        0.0,
        "seconds a `RedisSpider` waits, idle with an empty start key, before it closes;"
        " 0 waits forever",
        SPIDERS,
    ),
    Setting(
        "REDIS_ITEMS_KEY",
        "%(prefix)s:%(spider)s:items",
        "key template of the list `celery_crawl.pipelines.RedisPipeline` appends items to"
        + _KEY_TEMPLATE,
        SPIDERS,
    ),
    Setting(
        "REDIS_ITEMS_SERIALIZER",
        "json",
        "how the pipeline encodes an item: `json` (Scrapy's JSON encoder) or the import path of"
        " a function of the item that returns `str` or `bytes`",
        SPIDERS,
    ),
    Setting("REDIS_ITEMS_BATCH_SIZE", 100, "items that force an immediate write to Redis", SPIDERS),
    Setting(
        "REDIS_ITEMS_FLUSH_DELAY",
        0.05,
        "seconds an item waits in the pipeline so that several reach Redis in one round trip",
        SPIDERS,
    ),
    # -- Shared cookies ------------------------------------------------------
    Setting(
        "COOKIES_SHARED",
        False,
        "share the spider's cookie jars through Redis, so a login made by one process serves"
        " every process (`celery_crawl.cookies.SharedCookiesMiddleware`; see docs/cookies.md)."
        " Set it in the spider's `custom_settings`",
        COOKIES,
    ),
    Setting(
        "COOKIES_SHARED_REFRESH",
        1.0,
        "seconds a process sends requests with its copy of a shared jar before it checks for"
        " changes made by other processes (requests derived from a response always see what that"
        " response stored); 0 checks before every request",
        COOKIES,
    ),
    Setting(
        "COOKIES_SHARED_TTL",
        86_400,
        "seconds a shared jar is kept in Redis after its last change",
        COOKIES,
    ),
    # -- Per-site politeness -------------------------------------------------
    Setting(
        "SITE_LIMITS_ENABLED",
        True,
        "hold every site to limits shared by all processes (docs/politeness.md): a request is"
        " leased only when its site may take one more; False leases in plain priority order"
        " (requests parked while limits were on come after the queue's own)",
        POLITENESS,
    ),
    Setting(
        "ROBOTSTXT_SHARED_SECONDS",
        86400.0,
        "with `ROBOTSTXT_OBEY`, how long a site's robots.txt, fetched by one process, serves"
        " every process before one fetches it again; its `Crawl-delay` spaces the site's"
        " requests for all of them, unless the site's own limits space them more",
        POLITENESS,
    ),
    Setting(
        "ROBOTSTXT_CRAWL_DELAY_MAX",
        60.0,
        "the longest robots.txt `Crawl-delay` obeyed, in seconds: a longer one (some sites ask"
        " for a day) spaces the site's requests this much; 0: no cap",
        POLITENESS,
    ),
    Setting(
        "SITE_KEY",
        "host",
        "what a site is: `host` (the URL's host name), `domain` (its registered domain, so"
        " `a.example.com` and `b.example.com` share limits) or `ip` (the address the host resolves"
        " to); a request's `meta['site']` wins",
        POLITENESS,
    ),
    Setting(
        "SITE_CONCURRENCY",
        -1,
        "requests of one site leased at once, across all processes; 0: no cap; -1: Scrapy's"
        " `CONCURRENT_REQUESTS_PER_DOMAIN` (8), now for the whole crawl, not per process",
        POLITENESS,
    ),
    Setting(
        "SITE_RATE",
        -1.0,
        "requests per second to one site, across all processes; 0: no rate; -1:"
        " 1 / `DOWNLOAD_DELAY` when that is set, else no rate",
        POLITENESS,
    ),
    Setting(
        "SITE_BURST",
        1,
        "requests a site may take at once above its rate after a quiet spell (1: evenly spaced)",
        POLITENESS,
    ),
    Setting(
        "SITE_OVERRIDES",
        {},
        "limits of named sites over the defaults: `{'forum.example': {'concurrency': 4,"
        " 'rate': 10, 'burst': 2}}`; a missing field keeps the default, 0 lifts it",
        POLITENESS,
    ),
    Setting(
        "SITE_BACKOFF_CODES",
        [429],
        "response codes that pause the site for every process: for its `Retry-After`, or else"
        " for a back-off that doubles with each one in a row. A code of SITE_OVERLOAD_CODES"
        " pauses the site too when it comes with a `Retry-After`",
        POLITENESS,
    ),
    Setting(
        "SITE_BACKOFF_SECONDS",
        1.0,
        "first back-off after a back-off code without `Retry-After`; it doubles with each"
        " further one in a row, up to SITE_BACKOFF_MAX",
        POLITENESS,
    ),
    Setting(
        "SITE_BACKOFF_MAX",
        60.0,
        "longest back-off, and the longest `Retry-After` honoured, in seconds",
        POLITENESS,
    ),
    Setting(
        "SITE_PAUSE_AFTER",
        8,
        "back-offs in a row after which the site is paused for SITE_PAUSE_SECONDS, its"
        " requests kept (0: never)",
        POLITENESS,
    ),
    Setting(
        "SITE_PAUSE_SECONDS",
        300.0,
        "how long a site that keeps failing is paused",
        POLITENESS,
    ),
    Setting(
        "SITE_OVERLOAD_CODES",
        [500, 502, 503, 504, 522, 524],
        "server errors that say a site may be overloaded (docs/politeness.md): retried as in"
        " plain Scrapy, they slow the site for every process only when they are more than"
        " SITE_OVERLOAD_SHARE of its recent responses (one with a `Retry-After` pauses it)",
        POLITENESS,
    ),
    Setting(
        "SITE_OVERLOAD_SHARE",
        0.1,
        "share of a site's last SITE_OVERLOAD_WINDOW responses that, once its server errors"
        " are more, slows the site to its rate of other responses less that share",
        POLITENESS,
    ),
    Setting(
        "SITE_OVERLOAD_WINDOW",
        100,
        "responses of a site (all processes) its share of server errors is measured over",
        POLITENESS,
    ),
    Setting(
        "SITE_OVERLOAD_MIN_RESPONSES",
        50,
        "fewest responses in the window before server errors can slow the site: 3 errors in"
        " 20 responses are not yet a share (2% of errors make more than 10% of 50 once in"
        " about 800 crawls of 3,000 responses, of 20 once in 60)",
        POLITENESS,
    ),
    Setting(
        "SITE_OVERLOAD_RECOVERY",
        30.0,
        "seconds in which a slowed site's interval between requests halves (its rate"
        " doubles), until it is back to its own limits",
        POLITENESS,
    ),
    # -- Environment variables -----------------------------------------------
    Setting(
        "BROWSER_MAX_PAGES",
        16,
        "pages a worker process's browser renders at once, for every spider it hosts together"
        " (more wait their turn); scrapy-playwright's `PLAYWRIGHT_MAX_PAGES_PER_CONTEXT` still"
        " caps each context",
        BROWSER,
    ),
    Setting(
        "BROWSER_RENDER_IF_MISSING",
        {},
        "callback name → CSS selector: with `celery_crawl.browser.middleware.RenderWhenNeeded`"
        " enabled, a plain 200 response for that callback in which the selector matches nothing"
        " is fetched again through the browser (a spider's `needs_browser(response)` decides"
        " instead when it has one)",
        BROWSER,
    ),
    Setting(
        "BROWSER_RECYCLE_PAGES",
        1000,
        "renders after which `BrowserDownloadHandler` closes its process's browser (once the"
        " renders under way end) and starts a new one, so that a long-lived worker's browser"
        " does not grow for good; 0: never",
        BROWSER,
    ),
    Setting(
        "BROWSER_RECYCLE_MEMORY_MB",
        0.0,
        "MiB that a worker process's browser (its Playwright driver and Chromium processes) may"
        " hold before it is recycled the same way, read every 20 renders; 0: no ceiling",
        BROWSER,
    ),
    Setting(
        "BROWSER_RENDER_TIMEOUT",
        120.0,
        'seconds one rendered request (`meta={"playwright": True}`) may take with'
        " `celery_crawl.browser.handler.BrowserDownloadHandler`, page methods included; past"
        " it the render fails as a download timeout, and is retried",
        BROWSER,
    ),
    Setting(
        "CELERY_BROKER_URL",
        None,
        "Celery's broker when `create_app` gets no `broker_url`. Unset: `REDIS_URL`, which must"
        " then be a single server",
        ENVIRONMENT,
        str,
    ),
    Setting(
        "CELERY_RESULT_BACKEND",
        None,
        "Celery's result backend when `create_app` gets no `result_backend`. Unset: `REDIS_URL`,"
        " or the broker when `REDIS_URL` is a cluster or a sentinel set",
        ENVIRONMENT,
        str,
    ),
    Setting(
        "CELERY_CRAWL_APP",
        None,
        "the Celery app of the `celery-crawl` commands (`--app`): `module` or `module:attribute`."
        " No default: the commands ask for it",
        ENVIRONMENT,
        str,
    ),
)


def _registry(entries: Iterable[Setting]) -> dict[str, Setting]:
    registry: dict[str, Setting] = {}
    for entry in entries:
        if entry.name in registry:
            raise ValueError(f"setting {entry.name} is registered twice")
        registry[entry.name] = entry
    return registry


SETTINGS: dict[str, Setting] = _registry(_ENTRIES)
"""Every setting, by name, in the order of the reference (section by section)."""

_GETTERS = {bool: "getbool", int: "getint", float: "getfloat"}


def setting(settings: Any, name: str) -> Any:
    """The value of setting ``name`` in ``settings``, typed, with the registry's default.

    ``settings`` is Scrapy settings, or any mapping of setting names. An
    unregistered ``name`` raises :class:`KeyError`.
    """
    entry = SETTINGS.get(name)
    if entry is None or not entry.scrapy:
        raise KeyError(_unknown(name))
    if not hasattr(settings, "getbool"):  # a plain mapping: read it the way Scrapy would
        from scrapy.settings import BaseSettings

        settings = BaseSettings(dict(settings))
    default = entry.default
    if entry.type is list:
        return settings.getlist(name, list(default))
    if entry.type is dict:
        return settings.getdict(name, dict(default))
    if entry.type is str:
        return settings.get(name, default)
    return getattr(settings, _GETTERS[entry.type])(name, default)


def _unknown(name: str) -> str:
    entry = SETTINGS.get(name)
    if entry is not None:
        return f"{name} is an environment variable, not a Scrapy setting: read os.environ"
    close = difflib.get_close_matches(name, [n for n, s in SETTINGS.items() if s.scrapy], n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (
        f"{name!r} is not a celery_crawl setting{hint}: register it, with its default and"
        " meaning, in celery_crawl/core/defaults.py"
    )


# -- the reference, docs/settings.md -----------------------------------------

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
COMMAND = "python -m celery_crawl.core.defaults --write"


def literal(value: Any) -> str:
    """A default as it would be written in a settings module."""
    if isinstance(value, tuple):
        return repr(list(value))
    if isinstance(value, Mapping):
        return repr(dict(value))
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:_}"
    return repr(value)


def render() -> str:
    """``docs/settings.md``: one table per section."""
    env = [f"`{s.name}`" for s in SETTINGS.values() if s.env]
    lines = [
        "# Settings",
        "",
        "<!-- generated from celery_crawl/core/defaults.py"
        f" by `{COMMAND}`: edit that, not this -->",
        "",
        "celery_crawl's components are configured with Scrapy settings: in the settings module,"
        " a spider's `custom_settings`, or `create_app(..., settings={...})`, which wins. A value"
        " given as a string, as the environment gives it, is read as the type of its default:"
        ' `"false"`, `"0.5"`, `"a,b"` for a list, JSON for a dict.',
        "",
        f"Hosted crawlers (`create_app`) also take {', '.join(env[:-1])} and {env[-1]} from the"
        " environment when set there, over the settings module, and the settings that"
        " `CELERY_CRAWL_ENV` names. The last table lists the environment variables that are not"
        " settings.",
        "",
        "Scrapy's own settings keep their meaning and defaults, except those listed here.",
    ]
    for section in SECTIONS:
        entries = [s for s in SETTINGS.values() if s.section == section]
        head = "variable" if section == ENVIRONMENT else "setting"
        lines += ["", f"## {section}", "", f"| {head} | default | meaning |", "|---|---|---|"]
        lines += [f"| `{s.name}` | `{literal(s.default)}` | {s.meaning} |" for s in entries]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m celery_crawl.core.defaults",
        description="Print the settings reference, or write it to docs/settings.md.",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"write {REFERENCE.name}")
    action.add_argument("--check", action="store_true", help=f"fail if {REFERENCE.name} differs")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        REFERENCE.write_text(text, encoding="utf-8")
    elif args.check:
        if not REFERENCE.is_file() or REFERENCE.read_text(encoding="utf-8") != text:
            print(f"docs/settings.md is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
