"""celery_crawl changes only its own app's workers: a plain Celery app beside it is untouched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery, signals
from celery.exceptions import TaskRevokedError
from celery.worker.control import Panel

import celery_crawl
from tests.support.workers import WORKER_SETTINGS, Worker

WORKER_SIGNALS = (
    signals.worker_init,
    signals.worker_process_init,
    signals.worker_process_shutdown,
    signals.worker_ready,
    signals.worker_shutting_down,
    signals.worker_shutdown,
)


def receivers() -> list[list[Any]]:
    return [list(signal.receivers or []) for signal in WORKER_SIGNALS]


def test_importing_and_creating_an_app_changes_nothing_global(env: dict[str, str]) -> None:
    before, revoke = receivers(), Panel.data["revoke"]
    from celery_crawl import crawl, create_app

    app = create_app("worker_app", WORKER_SETTINGS)
    plain = Celery("plain")
    assert callable(crawl)
    assert "celery_crawl.crawl" in app.tasks
    assert not [name for name in plain.tasks if name.startswith("celery_crawl")]
    assert receivers() == before
    assert Panel.data["revoke"] is revoke
    assert any(step.__name__ == "CrawlerHosting" for step in app.steps["worker"])


def test_the_public_api_is_lazy_and_complete() -> None:
    for name in celery_crawl.__all__:
        assert getattr(celery_crawl, name) is not None
    assert issubclass(celery_crawl.UnknownSpider, celery_crawl.CeleryCrawlError)
    with pytest.raises(AttributeError):
        celery_crawl.no_such_name  # noqa: B018


@pytest.mark.slow
def test_a_plain_app_worker_beside_a_crawl_app_is_untouched(
    env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    from tests.support.two_apps import plain

    worker = start_worker(
        "plain", pool="prefork", concurrency=1, app="tests.support.two_apps:plain"
    )
    assert plain.send_task("plain.nap", (0.1,)).get(timeout=30) == 0.1
    busy = plain.send_task("plain.nap", (2.0,))
    queued = plain.send_task("plain.nap", (0.2,))
    replies = plain.control.revoke(queued.id, reply=True, timeout=5)
    assert replies and "flagged as revoked" in str(replies)  # Celery's own revoke answered
    assert busy.get(timeout=30) == 2.0
    with pytest.raises(TaskRevokedError):
        queued.get(timeout=30)
    log = worker.output()
    assert "hosting crawlers" not in log
    assert "Crawler hosting" not in log
    assert "celery_crawl" not in log


@pytest.mark.slow
def test_the_crawl_app_of_the_same_module_hosts_its_crawlers(
    env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker("crawler", pool="solo", app="tests.support.two_apps:crawl_app")
    assert "hosting crawlers" in worker.output()
