"""Fixtures of the integration tests: the environment, app and processes of real Celery workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_crawl import create_app
from celery_crawl.core.connection import get_redis
from tests.support.workers import WORKER_SETTINGS, Worker, started_workers, worker_env


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
def state_client(env: dict[str, str]) -> redis.Redis:
    """A client of the server that holds the workers' crawl state."""
    return get_redis(env["REDIS_URL"])


@pytest.fixture
def app(env: dict[str, str]) -> Celery:
    return create_app("worker_app", WORKER_SETTINGS)


@pytest.fixture
def start_worker(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with started_workers(env, tmp_path) as start:
        yield start
