"""Fixtures for the tests that run real Celery workers (a pytest plugin, see conftest)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from paths_spider import PathsSite
from workers import Worker, worker_env

from celery_crawl import create_app
from tasks.site import SiteConfig, run_in_thread

_databases = itertools.cycle(range(1, 16))
FORUM = SiteConfig(forums=3, posts_per_forum=60, hot_every=20, hot_comment_pages=6)


@pytest.fixture
def db_url(redis_url: str) -> str:
    """A database of this test's own: Celery's queues and results stay apart."""
    base = redis_url.rsplit("/", 1)[0] if redis_url.count("/") > 2 else redis_url
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
def sites(forum_site: Any, paths_site: PathsSite) -> dict[str, str]:
    return {"FORUM_BASE_URL": forum_site.url, "PATHS_BASE_URL": paths_site.url}


@pytest.fixture
def env(
    db_url: str, prefix: str, sites: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    values = worker_env(db_url, prefix, sites["FORUM_BASE_URL"], tmp_path)
    values["PATHS_BASE_URL"] = sites["PATHS_BASE_URL"]
    for name in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX", "FORUM_BASE_URL", "PATHS_BASE_URL"):
        monkeypatch.setenv(name, values[name])
    return values


@pytest.fixture
def app(env: dict[str, str]) -> Celery:
    return create_app("worker_app", "worker_settings")


@pytest.fixture
def start_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(
        name: str = "w1",
        pool: str = "prefork",
        concurrency: int = 2,
        queues: str | None = None,
        app: str = "worker_app",
    ) -> Worker:
        worker = Worker(name, env, tmp_path / f"{name}.log", pool, concurrency, queues, app)
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()
