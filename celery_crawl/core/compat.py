"""scrapy-redis 0.9.1's class paths, each with its celery_crawl equivalent.

A scrapy-redis project moves over by changing imports and class paths
(``docs/migrating-from-scrapy-redis.md``). The queue, dupefilter and
serializer paths that celery_crawl resolves itself are aliases of its own
classes (``celery_crawl.queue.queues.QUEUE_CLASSES``,
``celery_crawl.dupefilter.filters.DUPEFILTER_CLASSES``, ``celery_crawl.codec.serializer.CODECS``).
Every other ``scrapy_redis.*`` path is refused with a :class:`ConfigError`
naming the replacement, never imported: scrapy-redis's own classes pickle
requests, use keys without a hash tag and read then write in Python.

Scrapy loads ``SCHEDULER``, ``STATS_CLASS``, ``ITEM_PIPELINES`` and the
spider class by itself, so celery_crawl cannot intercept them; instead each
celery_crawl component checks them when it is built (:func:`check_settings`).
"""

from __future__ import annotations

from typing import Any

from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError

PACKAGE = "scrapy_redis."

EQUIVALENTS: dict[str, str] = {
    "scrapy_redis.scheduler.Scheduler": "celery_crawl.scheduler.Scheduler",
    "scrapy_redis.stats.RedisStatsCollector": "celery_crawl.stats.RedisStatsCollector",
    "scrapy_redis.pipelines.RedisPipeline": "celery_crawl.pipelines.RedisPipeline",
    "scrapy_redis.spiders.RedisMixin": "celery_crawl.spiders.RedisMixin",
    "scrapy_redis.spiders.RedisSpider": "celery_crawl.spiders.RedisSpider",
    "scrapy_redis.spiders.RedisCrawlSpider": "celery_crawl.spiders.RedisCrawlSpider",
    "scrapy_redis.dupefilter.RFPDupeFilter": "celery_crawl.dupefilter.RFPDupeFilter",
    "scrapy_redis.queue.Base": "celery_crawl.queue.PriorityQueue",
    "scrapy_redis.queue.PriorityQueue": "celery_crawl.queue.PriorityQueue",
    "scrapy_redis.queue.SpiderPriorityQueue": "celery_crawl.queue.PriorityQueue",
    "scrapy_redis.queue.FifoQueue": "celery_crawl.queue.FifoQueue",
    "scrapy_redis.queue.SpiderQueue": "celery_crawl.queue.FifoQueue",
    "scrapy_redis.queue.LifoQueue": "celery_crawl.queue.LifoQueue",
    "scrapy_redis.queue.SpiderStack": "celery_crawl.queue.LifoQueue",
    "scrapy_redis.picklecompat": "signed_pickle",
    "scrapy_redis.connection.get_redis": "celery_crawl.connection.get_redis",
    "scrapy_redis.connection.get_redis_from_settings": "celery_crawl.connection.from_settings",
    "scrapy_redis.connection.from_settings": "celery_crawl.connection.from_settings",
    "scrapy_redis.get_redis": "celery_crawl.connection.get_redis",
    "scrapy_redis.get_redis_from_settings": "celery_crawl.connection.from_settings",
}
"""Every public scrapy-redis class, module and function a project names, and ours."""

# settings whose value Scrapy itself imports by path: checked at build time instead
SCRAPY_LOADED = ("SCHEDULER", "STATS_CLASS")


def equivalent(path: str) -> str:
    """The celery_crawl replacement of a ``scrapy_redis.*`` path (a guess for unknown ones)."""
    return EQUIVALENTS.get(path) or "celery_crawl." + path.removeprefix(PACKAGE)


def refusal(name: str, path: str) -> ConfigError:
    """The error for setting ``name`` naming scrapy-redis's own class ``path``."""
    known = path in EQUIVALENTS
    where = "" if known else " (not a scrapy-redis 0.9.1 name: check the spelling)"
    return ConfigError(
        f"{name} = {path!r} names scrapy-redis's own class{where}, which cannot share "
        f"celery_crawl's queue: set {name} = {equivalent(path)!r} "
        "(see docs/migrating-from-scrapy-redis.md)"
    )


def is_scrapy_redis(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(PACKAGE)


def scrapy_redis_paths(settings: Any) -> list[tuple[str, str]]:
    """(setting, path) for every scrapy-redis class the settings still name."""
    found = [(name, settings.get(name)) for name in SCRAPY_LOADED]
    pipelines = settings.getdict("ITEM_PIPELINES") if hasattr(settings, "getdict") else {}
    found += [("ITEM_PIPELINES", path) for path in pipelines]
    return [(name, path) for name, path in found if is_scrapy_redis(path)]


def check_settings(settings: Any, spidercls: type | None = None) -> None:
    """Refuse scrapy-redis classes that Scrapy would load beside celery_crawl's components."""
    problems = [str(refusal(name, path)) for name, path in scrapy_redis_paths(settings)]
    if spidercls is not None:
        problems += spider_problems(spidercls)
    problems += setting_problems(settings)
    if problems:
        raise ConfigError("; ".join(problems))


def spider_problems(spidercls: type) -> list[str]:
    bases = [f"{k.__module__}.{k.__name__}" for k in spidercls.__mro__]
    return [
        f"spider {spidercls.__name__} derives from scrapy-redis's {path}: import "
        f"{equivalent(path).rsplit('.', 1)[1]} from {equivalent(path).rsplit('.', 1)[0]} instead"
        for path in bases
        if path in EQUIVALENTS and path.startswith("scrapy_redis.spiders.")
    ][:1]


def setting_problems(settings: Any) -> list[str]:
    """scrapy-redis settings that celery_crawl cannot honour."""
    problems = []
    decode = setting(settings, "REDIS_PARAMS").get("decode_responses")
    if setting(settings, "REDIS_DECODE_RESPONSES") or decode:
        problems.append(
            "REDIS_DECODE_RESPONSES (or decode_responses in REDIS_PARAMS) cannot be true:"
            " queue entries are bytes; remove it"
        )
    chosen = setting(settings, "SCHEDULER_DUPEFILTER_CLASS")
    if chosen and chosen != setting(settings, "DUPEFILTER_CLASS"):
        problems.append(
            f"SCHEDULER_DUPEFILTER_CLASS = {chosen!r} is never read (scrapy-redis did not read it"
            " either): set DUPEFILTER_CLASS instead"
        )
    return problems
