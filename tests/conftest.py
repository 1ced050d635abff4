"""Fixtures of more than one folder, and the ``slow`` marker of the folders that start processes.

A real Redis-protocol server, a key prefix per test and a crawler (every folder); a database
of the test's own and the sites the workers crawl (integration and ha).
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy import Spider
from scrapy.crawler import Crawler
from scrapy.utils.test import get_crawler

from celery_crawl.core.connection import get_redis
from celery_crawl.demo.site import run_in_thread
from celery_crawl.tools import embedded
from tests.support.forum import FORUM
from tests.support.paths_spider import PathsSite
from tests.support.stub_spider import ForumSpider

pytest_plugins = ["tests.support.machine_share"]  # tests marked alone run by themselves

HERE = Path(__file__).parent
SLOW_FOLDERS = [HERE / "integration", HERE / "ha", HERE / "faults"]


def _own_databases() -> Iterator[int]:
    """Databases 1-15 (0 holds the crawl state, apart by key prefix), shared out among
    pytest-xdist's workers when they share one server (``REDIS_URL``): each cycles its slice.
    With an embedded server each worker has a server, and so all fifteen, of its own."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    if not os.environ.get("REDIS_URL") or count == 1:
        return itertools.cycle(range(1, 16))
    if count > 15:
        raise pytest.UsageError("with REDIS_URL set, run at most 15 xdist workers (-n 15)")
    size = 15 // count
    return itertools.cycle(range(1 + worker * size, 1 + (worker + 1) * size))


_databases = _own_databases()


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts processes is ``slow``: those of integration/, ha/ and faults/."""
    for item in items:
        if any(item.path.is_relative_to(folder) for folder in SLOW_FOLDERS):
            item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Why each rerun test failed its run before (``-rR`` names them only): a measurement
    taken again (``flaky``) shows which of its bounds the machine missed."""
    reruns = terminalreporter.stats.get("rerun", [])
    if reruns:
        terminalreporter.section("why each rerun ran")
    for report in reruns:
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = crash.message if crash is not None else str(report.longrepr)
        terminalreporter.line(f"{report.nodeid}: {' '.join(reason.split())[:600]}")


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A plain server: ``REDIS_URL`` when set; otherwise an embedded Valkey on a free port."""
    with embedded.redis_url() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url(server_url: str) -> str:
    """Where crawl state lives: the plain server, unless a module moves it (to a cluster)."""
    return server_url


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return get_redis(redis_url)


@pytest.fixture
def prefix(client: redis.Redis) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    value = f"test-{uuid.uuid4().hex[:10]}"
    yield value
    keys = list(client.scan_iter(match=f"{value}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def settings(redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "REDIS_URL": redis_url,
        "CELERY_CRAWL_KEY_PREFIX": prefix,
        "SCHEDULER": "celery_crawl.scheduler.Scheduler",
        "STATS_CLASS": "celery_crawl.stats.RedisStatsCollector",
        "LOG_LEVEL": "INFO",
    }


@pytest.fixture
def make_crawler(settings: dict[str, Any]) -> Any:
    def make(spidercls: type[Spider] = ForumSpider, **overrides: Any) -> Crawler:
        return get_crawler(spidercls, {**settings, **overrides})

    return make


@pytest.fixture
def db_url(server_url: str) -> str:
    """A database of this test's own on the plain server: Celery's queues and results stay apart."""
    base = server_url.rsplit("/", 1)[0] if server_url.count("/") > 2 else server_url
    url = f"{base}/{next(_databases)}"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture
def forum_site() -> Iterator[Any]:
    with run_in_thread(FORUM) as site:
        yield site


@pytest.fixture
def paths_site() -> Iterator[PathsSite]:
    with PathsSite() as site:
        yield site


@pytest.fixture
def feeds(tmp_path: Path) -> Path:
    """An empty folder for the jobs' feeds (``JOB_FEED_DIR``)."""
    folder = tmp_path / "job-feeds"
    folder.mkdir()
    return folder


@pytest.fixture
def sites(forum_site: Any, paths_site: PathsSite) -> dict[str, str]:
    return {"FORUM_BASE_URL": forum_site.url, "PATHS_BASE_URL": paths_site.url}
