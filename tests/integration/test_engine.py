"""The scheduler under Scrapy's real engine: two crawl processes share one queue."""

from __future__ import annotations

import os
from pathlib import Path

import redis

from celery_crawl.core.keys import SpiderKeys
from celery_crawl.demo.site import SiteConfig, run_in_thread
from tests.support.feeds import read_items
from tests.support.workers import start_process


def test_two_processes_crawl_one_forum_exactly_once(
    redis_url: str, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    config = SiteConfig(forums=2, posts_per_forum=60, hot_every=20, hot_comment_pages=8)
    expected = config.expected()
    with run_in_thread(config) as site:
        feeds = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
        seeder = [redis_url, prefix, site.url, str(feeds[0]), *config.forum_ids()]
        consumer = [redis_url, prefix, site.url, str(feeds[1])]
        logs = [tmp_path / "seeder.log", tmp_path / "consumer.log"]
        procs = [
            start_process("tests.support.forum_crawl", args, dict(os.environ), log)
            for args, log in zip((seeder, consumer), logs, strict=True)
        ]
        for proc, log in zip(procs, logs, strict=True):
            assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
        served = site.requests_served
    items = read_items(feeds[0]) + read_items(feeds[1])
    ids = [(item["kind"], item["id"]) for item in items]
    assert len(ids) == len(set(ids)), "an item was scraped twice"
    assert sum(kind == "post" for kind, _ in ids) == expected.posts
    assert sum(kind == "comment" for kind, _ in ids) == expected.comments
    assert read_items(feeds[0]) and read_items(feeds[1]), "both processes took part"
    assert served == expected.pages + expected.not_found  # each page fetched once
    keys = SpiderKeys.build("forum_e2e", prefix=prefix)
    assert client.zcard(keys.inflight) == 0, "every lease was acked"
    values = {k.decode(): v for k, v in client.hgetall(keys.stats).items()}
    assert int(values["item_scraped_count"]) == expected.posts + expected.comments
    assert int(values["downloader/response_count"]) == served
