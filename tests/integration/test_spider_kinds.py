"""Scrapy's generic spiders run unchanged on the shared queue: in two processes, and hosted.

Their requests carry callbacks that Scrapy's own classes keep private
(``CrawlSpider._callback``, ``SitemapSpider._parse_sitemap``): each one must
be queued, leased by either process and resolved there on its own spider.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_crawl import crawl
from celery_crawl.core.keys import SpiderKeys
from tests.support import kinds_crawl
from tests.support.feeds import read_items
from tests.support.static_site import StaticSite, serve
from tests.support.workers import Worker, killed_at_end

ENTRY = {
    "kind_crawl": "/",
    "kind_sitemap": "/sitemap.xml",
    "kind_xmlfeed": "/feed.xml",
    "kind_csvfeed": "/feed.csv",
}
FEED_SPIDERS = {"kind_xmlfeed", "kind_csvfeed"}


def crawl_in_two_processes(
    spider: str, site: StaticSite, redis_url: str, prefix: str, tmp_path: Path
) -> list[Path]:
    """A consumer, then (once it is open) a seeder; both run until the queue stays empty."""
    feeds = [tmp_path / "consumer.jsonl", tmp_path / "seeder.jsonl"]
    logs = [tmp_path / "consumer.log", tmp_path / "seeder.log"]
    common = [redis_url, prefix, spider]
    with killed_at_end() as procs:
        procs.append(kinds_crawl.start([*common, str(feeds[0])], logs[0]))
        kinds_crawl.wait_until_open(procs[0], logs[0])
        seeder = [*common, str(feeds[1]), site.url + ENTRY[spider]]
        procs.append(kinds_crawl.start(seeder, logs[1]))
        codes = [proc.wait(timeout=180) for proc in procs]
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    return feeds


@pytest.mark.parametrize("spider", list(ENTRY))
def test_two_processes_crawl_the_whole_site_once(
    spider: str, redis_url: str, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    with serve(StaticSite(feed_items=StaticSite.pages)) as site:  # the feeds list every page
        feeds = crawl_in_two_processes(spider, site, redis_url, prefix, tmp_path)
        hits = dict(site.hits)
    assert hits == {ENTRY[spider]: 1, **{path: 1 for path in site.page_paths()}}
    items = [read_items(feed) for feed in feeds]
    assert all(items), "both processes took part"
    urls = [item["url"] for item in items[0] + items[1]]
    assert sorted(urls) == sorted(site.url + path for path in site.page_paths())  # once each
    if spider in FEED_SPIDERS:  # cb_kwargs came through the queue
        ids = {item["url"]: item["id"] for item in items[0] + items[1]}
        assert sorted(ids.values()) == sorted(site.item_ids())
        assert ids[f"{site.url}/page/7.html"] == "item-7"
    keys = SpiderKeys.build(spider, prefix=prefix)
    assert client.zcard(keys.inflight) == 0, "every lease was acked"
    stats = {key.decode() for key in client.hkeys(keys.stats)}
    assert not {key for key in stats if "unserializable" in key or "dead_letter" in key}
    assert client.llen(keys.deadletter) == 0


def test_a_hosted_crawl_spider_runs_a_job_to_done(
    app: Celery, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    with serve(StaticSite()) as site:
        result = crawl("kind_crawl", [{"url": site.url + "/"}], app=app).wait(timeout=180)
        hits = dict(site.hits)
    assert result["state"] == "done"
    assert hits == {"/": 1, **{path: 1 for path in site.page_paths()}}
    assert result["pages"] == site.pages + 1
    assert result["items"] == site.pages
    assert result["errors"] == {}
    assert (result["queued"], result["in_flight"]) == (0, 0)
