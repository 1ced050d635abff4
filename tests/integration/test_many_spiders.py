"""A worker that hosts a project of 40 spiders: no thread per idle spider, CrawlerProcess's
reactor set-up, and a job of any of them crawls its site completely."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from celery import Celery

from celery_crawl import crawl, create_app
from celery_crawl.hosting.host import REAP_SECONDS
from tests.support.many_spiders import SPIDER_COUNT, spider_name
from tests.support.static_site import StaticSite, serve
from tests.support.workers import Worker

MANY_APP = "tests.support.many_app"
PAGES = 300


@pytest.fixture
def many_app(env: dict[str, str]) -> Celery:
    return create_app("many_app", "tests.support.many_settings")


def facts(app: Celery) -> dict[str, object]:
    """What the worker process that hosts the crawlers says of its reactor and threads."""
    return dict(app.send_task("tests.reactor_facts").get(timeout=30))


@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_forty_hosted_spiders_hold_no_thread_each_and_crawl_at_once(
    many_app: Celery, start_worker: Callable[..., Worker], tmp_path: Path, pool: str
) -> None:
    assert SPIDER_COUNT == 40
    worker = start_worker("w1", pool=pool, concurrency=1, app=MANY_APP)
    idle = facts(many_app)
    threads = [str(name) for name in idle["threads"]]  # type: ignore[attr-defined]
    # the crawlers wait on one notices thread and beat in one heartbeats thread
    assert not [name for name in threads if "link_pages" in name or name == "ended jobs"]
    assert threads.count("notices") == 1 and threads.count("heartbeats") == 1, threads
    assert len(threads) <= 8, threads  # Celery's, crochet's, ours: none per spider
    assert idle["pool_working"] == 0  # Twisted's pool is free for name lookups
    assert idle["reap_intervals"] == [REAP_SECONDS]  # not crochet's 0.1 s: an idle reactor
    # CrawlerProcess's reactor set-up: the thread pool's size and Scrapy's caching resolver
    assert idle["pool_max"] == 7
    assert idle["resolver"] == "CachingThreadedResolver"
    assert idle["dns_cache_limit"] == 321
    with serve(StaticSite(pages=PAGES)) as site:
        url = site.url.replace("127.0.0.1", "localhost")  # a name for the resolver to look up
        result = crawl(spider_name(SPIDER_COUNT // 2), [url + "/"], app=many_app).wait(timeout=180)
        assert result["state"] == "done", result
        assert sorted(site.hits) == sorted(["/", *site.page_paths()])  # every page
        assert result["items"] == sum(site.hits.values())  # an item per page fetched
        # each once; the seed, which is not filtered, may be fetched again from a link
        assert max(hits for path, hits in site.hits.items() if path != "/") == 1
    assert "localhost" in facts(many_app)["dns_cached"]  # type: ignore[operator]
    assert worker.stop() == 0
