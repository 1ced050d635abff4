"""Every dotted path users type in settings keeps working after the move to packages.

The code lives in a package per concept; the paths below are what settings, docs and
scrapy-redis's aliases name. Each loads, and is the very object of the code's home.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from kombu.utils.imports import symbol_by_name
from scrapy.utils.misc import load_object

from celery_crawl.core.compat import EQUIVALENTS
from celery_crawl.core.defaults import SETTINGS
from celery_crawl.core.exports import MOVED

ROOT = Path(__file__).resolve().parents[2]

# settings path -> where the code lives
PATHS = {
    "celery_crawl.scheduler.Scheduler": "celery_crawl.scheduler.scheduler.Scheduler",
    "celery_crawl.stats.RedisStatsCollector": "celery_crawl.stats.collector.RedisStatsCollector",
    "celery_crawl.queue.Base": "celery_crawl.queue.queues.Base",
    "celery_crawl.queue.PriorityQueue": "celery_crawl.queue.queues.PriorityQueue",
    "celery_crawl.queue.FifoQueue": "celery_crawl.queue.queues.FifoQueue",
    "celery_crawl.queue.LifoQueue": "celery_crawl.queue.queues.LifoQueue",
    "celery_crawl.queue.LifoPriorityQueue": "celery_crawl.queue.queues.LifoPriorityQueue",
    "celery_crawl.queue.Entry": "celery_crawl.core.entries.Entry",
    "celery_crawl.dupefilter.RFPDupeFilter": "celery_crawl.dupefilter.filters.RFPDupeFilter",
    "celery_crawl.dupefilter.BloomDupeFilter": "celery_crawl.dupefilter.filters.BloomDupeFilter",
    "celery_crawl.dupefilter.ExpiringDupeFilter": (
        "celery_crawl.dupefilter.filters.ExpiringDupeFilter"
    ),
    "celery_crawl.dupefilter.HitExpiringDupeFilter": (
        "celery_crawl.dupefilter.filters.HitExpiringDupeFilter"
    ),
    "celery_crawl.cookies.SharedCookiesMiddleware": (
        "celery_crawl.cookies.middleware.SharedCookiesMiddleware"
    ),
    "celery_crawl.politeness.SiteLimitsMiddleware": (
        "celery_crawl.politeness.middleware.SiteLimitsMiddleware"
    ),
    "celery_crawl.pipelines.RedisPipeline": "celery_crawl.hosting.pipelines.RedisPipeline",
    "celery_crawl.spiders.RedisSpider": "celery_crawl.hosting.spiders.RedisSpider",
    "celery_crawl.spiders.RedisCrawlSpider": "celery_crawl.hosting.spiders.RedisCrawlSpider",
    "celery_crawl.spiders.RedisMixin": "celery_crawl.hosting.spiders.RedisMixin",
    "celery_crawl.middleware.JobSpiderMiddleware": (
        "celery_crawl.hosting.middleware.JobSpiderMiddleware"
    ),
    "celery_crawl.middleware.JobDownloaderMiddleware": (
        "celery_crawl.hosting.middleware.JobDownloaderMiddleware"
    ),
    "celery_crawl.middleware.JobDepthMiddleware": (
        "celery_crawl.hosting.middleware.JobDepthMiddleware"
    ),
    "celery_crawl.middleware.HostedStartMiddleware": (
        "celery_crawl.hosting.middleware.HostedStartMiddleware"
    ),
    "celery_crawl.logcontext.LogContextExtension": (
        "celery_crawl.jobs.logcontext.LogContextExtension"
    ),
    "celery_crawl.logcontext.LogContextSpiderMiddleware": (
        "celery_crawl.jobs.logcontext.LogContextSpiderMiddleware"
    ),
    "celery_crawl.logcontext.LogContextDownloaderMiddleware": (
        "celery_crawl.jobs.logcontext.LogContextDownloaderMiddleware"
    ),
    "celery_crawl.logcontext.CrawlFormatter": "celery_crawl.jobs.logcontext.CrawlFormatter",
    "celery_crawl.feeds.JobFeedExporter": "celery_crawl.hosting.feeds.JobFeedExporter",
    "celery_crawl.fingerprint.VersionedRequestFingerprinter": (
        "celery_crawl.codec.fingerprint.VersionedRequestFingerprinter"
    ),
    "celery_crawl.connection.get_redis": "celery_crawl.core.connection.get_redis",
    "celery_crawl.connection.from_settings": "celery_crawl.core.connection.from_settings",
    "celery_crawl.app.create_app": "celery_crawl.app.factory.create_app",
    "celery_crawl.app.broker.Transport": "celery_crawl.app.broker.Transport",
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_settings_path_is_the_object_of_its_home(path: str) -> None:
    assert load_object(path) is load_object(PATHS[path])


def test_every_scrapy_redis_alias_names_a_listed_path() -> None:
    ours = {value for value in EQUIVALENTS.values() if value.startswith("celery_crawl.")}
    assert len(ours) > 10
    assert ours <= set(PATHS), sorted(ours - set(PATHS))
    for alias, path in EQUIVALENTS.items():
        if path.startswith("celery_crawl."):
            assert load_object(path) is load_object(PATHS[path]), alias


def test_every_default_that_names_our_code_is_a_listed_path() -> None:
    named = set()
    for entry in SETTINGS.values():
        values = entry.default if isinstance(entry.default, tuple | dict) else (entry.default,)
        named |= {v for v in values if isinstance(v, str) and v.startswith("celery_crawl.")}
    assert named <= set(PATHS), sorted(named - set(PATHS))


# every module of the flat layout before the packages (0.1's ``celery_crawl/*.py``)
FLAT = [
    "app",
    "bad_values",
    "broker",
    "buffer",
    "celery_tasks",
    "cli",
    "client",
    "compat",
    "components",
    "connection",
    "cookie_store",
    "cookies",
    "crawl_limits",
    "crawl_state",
    "defaults",
    "dupefilter",
    "embedded",
    "engine",
    "errors",
    "exporter",
    "feeds",
    "fingerprint",
    "heartbeat",
    "hosting",
    "http_server",
    "inputs",
    "jobs",
    "keys",
    "logcontext",
    "middleware",
    "notices",
    "participation",
    "pipelines",
    "politeness",
    "prefetch",
    "producer",
    "project",
    "queue",
    "registry",
    "repair",
    "routing",
    "scheduler",
    "scripts",
    "serializer",
    "sites",
    "spiders",
    "stats",
    "status",
    "tags",
    "trackers",
    "worker",
]
# names the old flat modules' docs told users to import, now from packages of those names
OLD_ATTRIBUTES = {
    "celery_crawl.jobs.Job": "celery_crawl.jobs.handle.Job",
    "celery_crawl.jobs.WAIT_OUTAGE_SECONDS": "celery_crawl.jobs.handle.WAIT_OUTAGE_SECONDS",
    "celery_crawl.jobs.LIMITS": "celery_crawl.jobs.limits.LIMITS",
    "celery_crawl.producer.Producer": "celery_crawl.producer.producer.Producer",
    "celery_crawl.hosting.CrawlerHost": "celery_crawl.hosting.host.CrawlerHost",
    "celery_crawl.queue.Lease": "celery_crawl.core.entries.Lease",
    "celery_crawl.errors.BadInput": "celery_crawl.core.errors.BadInput",
    "celery_crawl.sites.SitePolicy": "celery_crawl.politeness.sites.SitePolicy",
    "celery_crawl.project.project_of": "celery_crawl.hosting.project.project_of",
    "celery_crawl.registry.Registry": "celery_crawl.hosting.registry.Registry",
    "celery_crawl.defaults.setting": "celery_crawl.core.defaults.setting",
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_imports_as_its_new_home_with_a_warning(
    old: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, old, raising=False)  # the alias only: its code stays
    with pytest.warns(DeprecationWarning, match=rf"^{re.escape(old)} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists()


def test_every_module_of_the_flat_layout_still_imports() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in FLAT:
            assert importlib.import_module(f"celery_crawl.{name}").__name__.startswith(
                "celery_crawl."
            )


@pytest.mark.parametrize("path", sorted(OLD_ATTRIBUTES))
def test_an_old_documented_name_is_the_object_of_its_home(path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert load_object(path) is load_object(OLD_ATTRIBUTES[path])


def test_the_broker_transport_paths_load_as_kombu_loads_them() -> None:
    new = symbol_by_name("celery_crawl.app.broker:Transport")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert symbol_by_name("celery_crawl.broker:Transport") is new


def test_python_m_of_a_moved_module_runs_the_new_one() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "celery_crawl.defaults", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "moved to celery_crawl.core.defaults" in out.stderr


def test_the_docs_list_every_moved_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for old, new in MOVED.items():
        assert f"`{old}` → `{new}`" in doc, old
