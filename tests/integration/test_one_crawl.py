"""Plain ``scrapy crawl`` processes on one queue make one crawl (:mod:`celery_crawl.crawl`).

Each test starts the same spider, with the same start URL, in real processes
on a local static site; the site holds every answer back (its gate) until all
of them are open, so that they crawl together whatever the machine's load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from celery_crawl.core.keys import SpiderKeys
from tests.support import ROOT, one_crawl
from tests.support.feeds import read_items
from tests.support.static_site import StaticSite, serve
from tests.support.workers import Process, killed_at_end


@contextmanager
def processes(
    count: int, spider: str, url: str, redis_url: str, prefix: str, tmp_path: Path, **overrides: Any
) -> Iterator[list[Process]]:
    """``count`` processes of ``spider``; each killed at the end if still running."""
    with killed_at_end() as procs:
        for n in range(count):
            args = [redis_url, prefix, spider, str(tmp_path / f"items{n}.jsonl"), url]
            procs.append(one_crawl.start(args, tmp_path / f"crawl{n}.log", overrides))
        yield procs


def crawl_together(
    spider: str,
    site: StaticSite,
    path: str,
    env: tuple[str, str, redis.Redis, Path],
    count: int = 2,
    **overrides: Any,
) -> list[Path]:
    """``count`` processes, the site's answers held until all are open; their logs."""
    redis_url, prefix, client, tmp_path = env
    site.gate = threading.Event()
    keys = SpiderKeys.build(spider, prefix=prefix)
    with processes(count, spider, site.url + path, redis_url, prefix, tmp_path, **overrides) as ps:
        try:
            one_crawl.wait_until_open(client, keys, count, ps)
        finally:
            site.gate.set()
        codes = [proc.wait(timeout=180) for proc in ps]
    logs = [tmp_path / f"crawl{n}.log" for n in range(count)]
    assert codes == [0] * count, "\n".join(log.read_text()[-3000:] for log in logs)
    return logs


def items_of(tmp_path: Path, count: int = 2) -> list[dict[str, str]]:
    return [i for n in range(count) for i in read_items(tmp_path / f"items{n}.jsonl")]


def test_two_processes_run_the_start_requests_once(
    redis_url: str, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    with serve(StaticSite(pages=200, feed_items=100)) as site:
        crawl_together("one_feed", site, "/feed.xml", (redis_url, prefix, client, tmp_path))
        hits = dict(site.hits)
    assert hits["/feed.xml"] == 1
    items = items_of(tmp_path)
    ids = [item["id"] for item in items if "id" in item]
    assert sorted(ids) == sorted(site.item_ids()), "each entry yielded once"
    urls = [item["url"] for item in items if "url" in item]
    assert sorted(urls) == sorted(site.url + f"/page/{n}.html" for n in range(1, 101))
    keys = SpiderKeys.build("one_feed", prefix=prefix)
    assert not client.exists(keys.crawl), "the last process to close ended the crawl"


def test_every_process_runs_them_when_asked(
    redis_url: str, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    env = (redis_url, prefix, client, tmp_path)
    with serve(StaticSite(pages=200, feed_items=20)) as site:
        crawl_together("one_feed", site, "/feed.xml", env, SCHEDULER_START_REQUESTS="every")
        hits = dict(site.hits)
    assert hits["/feed.xml"] == 2
    assert len([item for item in items_of(tmp_path) if "id" in item]) == 2 * 20


def test_runspider_keeps_an_item_class_of_the_spider_file(
    redis_url: str, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    spider_file = ROOT / "tests" / "support" / "runspider_item.py"
    feed, log = tmp_path / "items.jsonl", tmp_path / "runspider.log"
    with serve(StaticSite(pages=50)) as site:
        settings = {**one_crawl.settings(redis_url, prefix, str(feed)), "FEEDS": ""}
        command = [sys.executable, "-m", "scrapy", "runspider", str(spider_file)]
        command += ["-a", f"url={site.url}/page/1.html", "-o", f"{feed}:jsonlines"]
        command += [
            arg for name, value in settings.items() if value for arg in ("-s", f"{name}={value}")
        ]
        with log.open("wb") as out:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            done = subprocess.run(
                command,
                check=False,
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=180,
            )
    code = done.returncode
    assert code == 0, log.read_text()[-3000:]
    items = read_items(feed)
    targets = sorted(item["target"] for item in items)
    assert targets == sorted(f"{site.url}/page/{n}.html" for n in site.links(1)), "items kept"
    assert all(item["source"] == f"{site.url}/page/1.html" for item in items)
    assert "dropped a request" not in log.read_text()


PAGE_LIMIT, CONCURRENCY = 30, 4


def test_a_page_limit_holds_for_the_whole_crawl(
    redis_url: str, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    env = (redis_url, prefix, client, tmp_path)
    limits = {"CLOSESPIDER_PAGECOUNT": PAGE_LIMIT, "CONCURRENT_REQUESTS": CONCURRENCY}
    with serve(StaticSite(pages=1500)) as site:
        logs = crawl_together("one_pages", site, "/", env, **limits)
        fetched = sum(site.hits.values())
    # the slack: what each process was downloading when the limit was reached
    assert PAGE_LIMIT <= fetched <= PAGE_LIMIT + 2 * CONCURRENCY
    for log in logs:
        assert "Spider closed (closespider_pagecount)" in log.read_text()


def test_a_new_crawl_starts_with_fresh_stats_and_a_process_tells_its_own(
    redis_url: str, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    keys = SpiderKeys.build("one_feed", prefix=prefix)
    pages = []
    with serve(StaticSite(pages=50, feed_items=20)) as site:
        for run in range(2):  # one after the other: two crawls, SCHEDULER_PERSIST off
            runs = tmp_path / f"run{run}"
            runs.mkdir()
            logs = crawl_together(
                "one_feed", site, "/feed.xml", (redis_url, prefix, client, runs), 1
            )
            pages.append(int(client.hget(keys.stats, "response_received_count") or 0))
    assert pages == [21, 21], "the feed and its 20 pages, in each crawl"
    text = logs[0].read_text()
    assert "Dumping Scrapy stats, this process only:" in text
    assert f"Dumping Scrapy stats, the whole crawl (every process, Redis hash {keys.stats})" in text
