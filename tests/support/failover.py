"""Shared by the HA tests: a worker app on cluster or sentinel state, and the nothing-lost check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_crawl import create_app
from tests.support.forum import FORUM
from tests.support.workers import WORKER_SETTINGS, worker_env


def ha_app(
    url: str,
    broker_url: str,
    sites: dict[str, str],
    prefix: str,
    directory: Path,
    monkeypatch: pytest.MonkeyPatch,
    params: dict[str, Any] | None = None,
) -> tuple[Celery, dict[str, Any]]:
    """An app and a worker environment: crawl state at ``url``, Celery on a plain Redis.

    ``params`` become ``REDIS_PARAMS`` (a JSON string in the environment).
    """
    env: dict[str, Any] = worker_env(url, prefix, sites["FORUM_BASE_URL"], directory)
    env |= {"PATHS_BASE_URL": sites["PATHS_BASE_URL"], "CELERY_BROKER_URL": broker_url}
    env["REDIS_PARAMS"] = json.dumps(params or {})
    for name in (
        "REDIS_PARAMS",
        "REDIS_URL",
        "CELERY_CRAWL_KEY_PREFIX",
        "FORUM_BASE_URL",
        "PATHS_BASE_URL",
        "CELERY_BROKER_URL",  # Celery's own variable: broker and results
    ):
        monkeypatch.setenv(name, env[name])
    return create_app("worker_app", WORKER_SETTINGS), env


def assert_nothing_lost(
    result: dict[str, Any], served: dict[str, int], fetched_before: set[str], directory: Path
) -> None:
    """The job finished, crawled on after the kill, and every page and item arrived."""
    assert result["state"] == "done"
    expected = FORUM.expected()
    assert fetched_before < set(served)
    assert len(served) == expected.pages + expected.not_found  # every page, at least once
    assert item_ids(directory) == {"post": expected.posts, "comment": expected.comments}


def item_ids(directory: Path) -> dict[str, int]:
    """Distinct items per type in the feeds: re-crawled pages may repeat some, none may miss."""
    seen: set[tuple[str, str]] = set()
    for feed in directory.glob("*.jsonl"):
        for line in feed.read_text().splitlines():
            item = json.loads(line)
            seen.add((item["type"], str(item.get("comment_id") or item["post_id"])))
    return {kind: sum(1 for k, _ in seen if k == kind) for kind in ("post", "comment")}
