"""scrapy-redis's example spiders on celery_crawl's classes: two ``scrapy crawl`` processes each.

The spiders and settings are those of scrapy-redis's example project with
imports and class paths changed (``tests/support/scrapy_redis_examples.py``);
each runs in two processes over one shared queue against the static site.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import redis

from celery_crawl.core.keys import SpiderKeys, items_key
from celery_crawl.queue.queues import PriorityQueue
from tests.support.scrapy_redis_examples import MyCrawler, MySpider, start_key
from tests.support.static_site import StaticSite, serve
from tests.support.workers import killed_at_end, start_process

MODULE = "tests.support.scrapy_redis_examples"  # ``python -m`` it: one ``scrapy crawl``


def crawl_twice(spider: str, redis_url: str, prefix: str, site: StaticSite) -> None:
    """Two ``scrapy crawl``-style processes of ``spider``, each to its end (bounded)."""
    args = [spider, redis_url, prefix, site.url]
    with tempfile.TemporaryDirectory(prefix="scrapy-redis-examples-") as folder:
        logs = [Path(folder) / f"{n}.log" for n in range(2)]
        with killed_at_end() as procs:
            for log in logs:
                procs.append(start_process(MODULE, args, dict(os.environ), log))
            codes = [proc.wait(timeout=240) for proc in procs]
        assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)


def stored_items(client: redis.Redis, spider: str, prefix: str) -> list[dict[str, Any]]:
    key = items_key(spider, {"CELERY_CRAWL_KEY_PREFIX": prefix})
    return [json.loads(raw) for raw in client.lrange(key, 0, -1)]


def assert_crawled_once(client: redis.Redis, spider: str, prefix: str, site: StaticSite) -> None:
    """Every page fetched once, one item per page in Redis, nothing left in the queue."""
    pages = site.page_paths()
    assert {path: site.hits[path] for path in pages} == dict.fromkeys(pages, 1)
    items = stored_items(client, spider, prefix)
    urls = [item.get("url") or item.get("link") for item in items]
    assert sorted(urls) == sorted(site.url + path for path in pages)
    keys = SpiderKeys.build(spider, prefix=prefix)
    assert len(PriorityQueue(client, keys)) == 0
    assert client.zcard(keys.inflight) == 0, "every lease was acked"


def test_myspider_redis_reads_urls_and_json_from_the_start_key(
    redis_url: str, prefix: str, client: redis.Redis
) -> None:
    with serve(StaticSite()) as site:
        data = [
            site.url + path if n % 2 else json.dumps({"url": site.url + path, "meta": {"n": n}})
            for n, path in enumerate(site.page_paths())
        ]
        client.rpush(start_key(MySpider, prefix), *data)
        crawl_twice(MySpider.name, redis_url, prefix, site)
        assert_crawled_once(client, MySpider.name, prefix, site)
    assert client.llen(start_key(MySpider, prefix)) == 0
    assert all(
        item["name"].startswith("Page ") for item in stored_items(client, "myspider_redis", prefix)
    )


def test_mycrawler_redis_follows_every_link_from_a_start_url(
    redis_url: str, prefix: str, client: redis.Redis
) -> None:
    with serve(StaticSite()) as site:
        client.rpush(start_key(MyCrawler, prefix), site.url + "/")
        crawl_twice(MyCrawler.name, redis_url, prefix, site)
        assert_crawled_once(client, MyCrawler.name, prefix, site)
        assert site.hits["/"] == 1  # the rule follows pages only


def test_dmoz_crawlspider_runs_on_the_shared_queue(
    redis_url: str, prefix: str, client: redis.Redis
) -> None:
    with serve(StaticSite()) as site:
        crawl_twice("dmoz", redis_url, prefix, site)
        assert_crawled_once(client, "dmoz", prefix, site)
        # the two processes make one crawl: its start URL runs once (SCHEDULER_START_REQUESTS)
        assert site.hits["/"] == 1
