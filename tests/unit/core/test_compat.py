"""Every class path and setting of scrapy-redis 0.9.1 either works or is refused with a clear error.

The two tables below are the inventory: a test checks them against the
installed scrapy-redis's source, another against the tables of
docs/migrating-from-scrapy-redis.md, so the code, the tests and the doc
list the same names.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings

from celery_crawl.codec.serializer import CODECS, codec_from_name
from celery_crawl.core import compat
from celery_crawl.core.defaults import SETTINGS
from celery_crawl.core.errors import ConfigError
from celery_crawl.dupefilter.filters import RFPDupeFilter
from celery_crawl.queue.queues import FifoQueue, LifoQueue, PriorityQueue
from celery_crawl.scheduler.scheduler import Scheduler
from celery_crawl.stats.collector import RedisStatsCollector

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "migrating-from-scrapy-redis.md").read_text()
REFUSED = "refused"
IMPORT = "change the import"

# class path -> (where a project names it, what celery_crawl does with it)
CLASS_PATHS: dict[str, tuple[str, Any]] = {
    "scrapy_redis.scheduler.Scheduler": ("SCHEDULER", REFUSED),
    "scrapy_redis.stats.RedisStatsCollector": ("STATS_CLASS", REFUSED),
    "scrapy_redis.pipelines.RedisPipeline": ("ITEM_PIPELINES", REFUSED),
    "scrapy_redis.dupefilter.RFPDupeFilter": ("DUPEFILTER_CLASS", RFPDupeFilter),
    "scrapy_redis.queue.Base": ("SCHEDULER_QUEUE_CLASS", REFUSED),
    "scrapy_redis.queue.PriorityQueue": ("SCHEDULER_QUEUE_CLASS", PriorityQueue),
    "scrapy_redis.queue.SpiderPriorityQueue": ("SCHEDULER_QUEUE_CLASS", PriorityQueue),
    "scrapy_redis.queue.FifoQueue": ("SCHEDULER_QUEUE_CLASS", FifoQueue),
    "scrapy_redis.queue.SpiderQueue": ("SCHEDULER_QUEUE_CLASS", FifoQueue),
    "scrapy_redis.queue.LifoQueue": ("SCHEDULER_QUEUE_CLASS", LifoQueue),
    "scrapy_redis.queue.SpiderStack": ("SCHEDULER_QUEUE_CLASS", LifoQueue),
    "scrapy_redis.picklecompat": ("SCHEDULER_SERIALIZER", "signed_pickle"),
    "scrapy_redis.spiders.RedisMixin": ("spider base class", REFUSED),
    "scrapy_redis.spiders.RedisSpider": ("spider base class", REFUSED),
    "scrapy_redis.spiders.RedisCrawlSpider": ("spider base class", REFUSED),
    "scrapy_redis.connection.get_redis": ("import", IMPORT),
    "scrapy_redis.connection.get_redis_from_settings": ("import", IMPORT),
    "scrapy_redis.connection.from_settings": ("import", IMPORT),
    "scrapy_redis.get_redis": ("import", IMPORT),
    "scrapy_redis.get_redis_from_settings": ("import", IMPORT),
}

WORKS = "works"
SCRAPY = "Scrapy's own"
# setting -> what celery_crawl does with it; (REFUSED, value) is refused with that value
SCRAPY_REDIS_SETTINGS: dict[str, Any] = {
    "REDIS_URL": WORKS,
    "REDIS_HOST": WORKS,
    "REDIS_PORT": WORKS,
    "REDIS_DB": WORKS,
    "REDIS_PARAMS": WORKS,
    "REDIS_ENCODING": WORKS,
    "REDIS_DECODE_RESPONSES": (REFUSED, True),
    "SCHEDULER_PERSIST": WORKS,
    "SCHEDULER_FLUSH_ON_START": WORKS,
    "SCHEDULER_IDLE_BEFORE_CLOSE": WORKS,
    "SCHEDULER_QUEUE_KEY": WORKS,
    "SCHEDULER_QUEUE_CLASS": WORKS,
    "SCHEDULER_DUPEFILTER_KEY": WORKS,
    "SCHEDULER_DUPEFILTER_CLASS": (REFUSED, "my.DupeFilter"),
    "SCHEDULER_SERIALIZER": WORKS,
    "DUPEFILTER_CLASS": WORKS,
    "DUPEFILTER_DEBUG": SCRAPY,
    "CONCURRENT_REQUESTS": SCRAPY,
    "STATS_KEY": WORKS,
    "REDIS_START_URLS_KEY": WORKS,
    "REDIS_START_URLS_AS_SET": WORKS,
    "REDIS_START_URLS_AS_ZSET": WORKS,
    "REDIS_START_URLS_BATCH_SIZE": WORKS,
    "MAX_IDLE_TIME_BEFORE_CLOSE": WORKS,
    "REDIS_ITEMS_KEY": WORKS,
    "REDIS_ITEMS_SERIALIZER": WORKS,
}


def scrapy_redis_names() -> tuple[set[str], set[str]]:
    """The public class paths and the setting names of the installed scrapy-redis."""
    package = importlib.import_module("scrapy_redis")  # in the test extra: never skipped
    folder = Path(package.__file__).parent
    paths = {f"scrapy_redis.{name}" for name in ("get_redis", "get_redis_from_settings")}
    paths.add("scrapy_redis.picklecompat")
    for module in ("scheduler", "queue", "dupefilter", "stats", "pipelines", "spiders"):
        mod = importlib.import_module(f"scrapy_redis.{module}")
        paths |= {
            f"{mod.__name__}.{name}"
            for name, obj in vars(mod).items()
            if inspect.isclass(obj) and obj.__module__ == mod.__name__
        }
    connection = importlib.import_module("scrapy_redis.connection")
    paths |= {
        f"{connection.__name__}.{name}"
        for name, obj in vars(connection).items()
        if inspect.isfunction(obj) and obj.__module__ == connection.__name__
    }
    source = "\n".join(p.read_text() for p in folder.glob("*.py"))
    settings = set(re.findall(r'"([A-Z][A-Z_]{3,})"', source)) - {"POST", "ZADD"}
    settings |= {"REDIS_START_URLS_BATCH_SIZE"}  # in RedisSpider's docstring only
    settings |= {"SCHEDULER_DUPEFILTER_CLASS"}  # in its defaults, never read
    return paths, settings


def test_the_tables_list_every_name_of_scrapy_redis() -> None:
    paths, settings = scrapy_redis_names()
    assert set(CLASS_PATHS) == paths
    assert set(SCRAPY_REDIS_SETTINGS) == settings
    assert set(compat.EQUIVALENTS) == paths


def test_the_migration_guide_lists_the_same_names() -> None:
    first_cells = set(re.findall(r"^\| `([\w.]+)`", DOC, re.MULTILINE))
    assert first_cells == set(CLASS_PATHS) | set(SCRAPY_REDIS_SETTINGS)
    for path in CLASS_PATHS:  # and each with its equivalent
        assert f"`{compat.equivalent(path)}`" in DOC, path


@pytest.mark.parametrize("path", sorted(CLASS_PATHS))
def test_every_equivalent_exists(path: str) -> None:
    target = compat.equivalent(path)
    if CLASS_PATHS[path][0] == "SCHEDULER_SERIALIZER":  # a codec's name, not a path
        assert target in CODECS
        return
    module, _, name = target.rpartition(".")
    assert getattr(importlib.import_module(module), name)


QUEUE_AND_DEDUP = sorted(
    p
    for p, (where, _) in CLASS_PATHS.items()
    if where in ("SCHEDULER_QUEUE_CLASS", "DUPEFILTER_CLASS")
)


@pytest.mark.parametrize("path", QUEUE_AND_DEDUP)
def test_queue_and_dupefilter_paths_are_aliases_or_refused(make_crawler: Any, path: str) -> None:
    where, outcome = CLASS_PATHS[path]
    crawler = make_crawler(**{where: path})
    if outcome == REFUSED:
        with pytest.raises(ConfigError, match=re.escape(compat.equivalent(path))):
            Scheduler.from_crawler(crawler)
        return
    scheduler = Scheduler.from_crawler(crawler)
    built = scheduler.queue if where == "SCHEDULER_QUEUE_CLASS" else scheduler.df
    assert type(built) is outcome


def test_the_pickle_serializer_means_signed_pickle() -> None:
    assert (
        codec_from_name("scrapy_redis.picklecompat", secret="s" * 32).name
        == CLASS_PATHS["scrapy_redis.picklecompat"][1]
    )


def test_an_unknown_scrapy_redis_path_is_refused_not_imported(make_crawler: Any) -> None:
    crawler = make_crawler(SCHEDULER_QUEUE_CLASS="scrapy_redis.queue.NoSuchQueue")
    with pytest.raises(ConfigError, match="check the spelling"):
        Scheduler.from_crawler(crawler)


SCRAPY_LOADED = sorted(
    p
    for p, (where, _) in CLASS_PATHS.items()
    if where in ("SCHEDULER", "STATS_CLASS", "ITEM_PIPELINES")
)


@pytest.mark.parametrize("path", SCRAPY_LOADED)
def test_paths_scrapy_loads_itself_are_refused_by_our_components(path: str) -> None:
    where, _ = CLASS_PATHS[path]
    value: Any = {path: 400} if where == "ITEM_PIPELINES" else path
    with pytest.raises(ConfigError, match=re.escape(f"{where} = '{compat.equivalent(path)}'")):
        compat.check_settings(Settings({where: value}))


def test_our_scheduler_refuses_scrapy_redis_stats(make_crawler: Any) -> None:
    crawler = make_crawler(STATS_CLASS="scrapy_redis.stats.RedisStatsCollector")
    with pytest.raises(ConfigError, match=re.escape("celery_crawl.stats.RedisStatsCollector")):
        Scheduler.from_crawler(crawler)


def test_our_stats_refuse_the_scrapy_redis_scheduler(make_crawler: Any) -> None:
    # Scrapy builds the stats collector with the crawler, before any scheduler
    with pytest.raises(ConfigError, match=re.escape("celery_crawl.scheduler.Scheduler")):
        make_crawler(SCHEDULER="scrapy_redis.scheduler.Scheduler")
    assert RedisStatsCollector(make_crawler())  # celery_crawl's own scheduler is fine


@pytest.mark.parametrize("name", ["RedisSpider", "RedisCrawlSpider", "RedisMixin"])
def test_a_scrapy_redis_spider_is_refused_by_our_scheduler(make_crawler: Any, name: str) -> None:
    module = importlib.import_module("scrapy_redis.spiders")
    from scrapy import Spider

    bases = (getattr(module, name), Spider) if name == "RedisMixin" else (getattr(module, name),)
    spidercls = type("Legacy", bases, {"name": "legacy"})
    with pytest.raises(ConfigError, match=f"import {name} from celery_crawl.spiders"):
        Scheduler.from_crawler(make_crawler(spidercls))


@pytest.mark.parametrize("name", sorted(SCRAPY_REDIS_SETTINGS))
def test_every_setting_works_or_is_refused(name: str) -> None:
    outcome = SCRAPY_REDIS_SETTINGS[name]
    if outcome == SCRAPY:
        assert Settings().get(name) is not None, f"{name} is not one of Scrapy's settings"
        return
    assert name in SETTINGS, f"{name} is not registered in celery_crawl/core/defaults.py"
    compat.check_settings(Settings({name: SETTINGS[name].default}))  # its default is fine
    if outcome != WORKS:
        _, value = outcome
        with pytest.raises(ConfigError, match=name):
            compat.check_settings(Settings({name: value}))
