"""A login made by one ``scrapy crawl`` process serves another that shares its queue."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celery_crawl import crawl as crawl_job
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.hosting.project import project_of
from tests.support.feeds import read_items
from tests.support.static_site import StaticSite, serve
from tests.support.workers import Process, Worker, start_process

PAGES = 120


def crawl(args: list[str], log: Path) -> Process:
    return start_process("tests.support.members_crawl", args, dict(os.environ), log)


def wait_for_file(path: Path, proc: Process, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, "the waiting process ended before its spider opened"
        assert time.monotonic() < deadline, f"{path.name} not written in {timeout} s"
        time.sleep(0.1)


def run_pair(redis_url: str, prefix: str, site: StaticSite, tmp: Path, shared: str) -> list[Path]:
    """The waiting process first; once its spider is open, the one that logs in."""
    feeds, ready = [tmp / "login.jsonl", tmp / "other.jsonl"], tmp / "ready"
    common = [redis_url, prefix, site.url]
    logs = [tmp / "login.log", tmp / "other.log"]
    other = crawl([*common, str(feeds[1]), f"wait:{ready}", shared, str(PAGES)], logs[1])
    procs = [other]
    try:
        wait_for_file(ready, other)
        procs.append(crawl([*common, str(feeds[0]), "login", shared, str(PAGES)], logs[0]))
        for proc in procs:
            assert proc.wait(timeout=180) == 0, "\n".join(log.read_text()[-3000:] for log in logs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return feeds


def test_a_login_in_one_process_serves_the_other(
    redis_url: str, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    with serve(StaticSite(pages=PAGES)) as site:
        feeds = run_pair(redis_url, prefix, site, tmp_path, "on")
        hits, statuses = Counter(site.hits), Counter(site.statuses)
    login, other = read_items(feeds[0]), read_items(feeds[1])
    assert login and other, "both processes fetched member pages"
    assert sorted(item["n"] for item in login + other) == list(range(1, PAGES + 1))
    assert {item["status"] for item in login + other} == {200}
    assert hits["/login"] == 1, "only one process logged in"
    assert all(hits[f"/members/{n}.html"] == 1 for n in range(1, PAGES + 1))
    assert statuses == {200: PAGES + 1}, "not one 403 at the site"
    jar = SpiderKeys.build("members_e2e", prefix=prefix).cookie_jar("", "default")
    assert b"127.0.0.1|/|session" in client.hkeys(jar)


def test_without_the_shared_jar_the_other_process_gets_403s(
    redis_url: str, prefix: str, client: redis.Redis, tmp_path: Path
) -> None:
    """The same crawl with COOKIES_SHARED off, as users saw it: the test above can fail.

    The login request goes through the shared queue too, so either process may
    fetch it: the one that does gets 200s, the other one 403s.
    """
    with serve(StaticSite(pages=PAGES)) as site:
        feeds = run_pair(redis_url, prefix, site, tmp_path, "off")
    statuses = [frozenset(item["status"] for item in read_items(feed)) for feed in feeds]
    assert set(statuses) == {frozenset({200}), frozenset({403})}, statuses
    assert not list(client.scan_iter(match=f"{prefix}:*cookies*"))


def test_a_hosted_jobs_login_serves_both_worker_processes_and_no_other_job(
    app: Celery,
    start_worker: Callable[..., Worker],
    state_client: redis.Redis,
    tmp_path: Path,
) -> None:
    """Job A logs in once; its member pages, leased by two processes, are all 200. Job B,
    of the same spider at the same time, never logged in: its jar is its own, all 403."""
    workers = [start_worker("w1", pool="solo"), start_worker("w2", pool="solo")]
    pages = 200
    with serve(StaticSite(pages=pages)) as site:
        seed = {"site": site.url, "pages": pages}
        a = crawl_job("hosted_members", [{**seed, "tag": "a", "login": True}], app=app)
        b = crawl_job("hosted_members", [{**seed, "tag": "b", "login": False}], app=app)
        results = {tag: job.wait(timeout=180) for tag, job in (("a", a), ("b", b))}
        assert site.hits["/login"] == 1
    assert {tag: r["state"] for tag, r in results.items()} == {"a": "done", "b": "done"}
    keys = project_of(app).keys("hosted_members")
    jar = state_client.hgetall(keys.cookie_jar(a.id, "default"))
    assert any(field.endswith(b"|session") for field in jar)  # job A's jar, in Redis
    assert 0 < state_client.ttl(keys.cookie_jar(a.id, "default")) <= 86_400  # with an expiry
    assert not state_client.exists(keys.cookie_jar(b.id, "default"))

    assert [worker.stop() for worker in workers] == [0, 0]  # closes the feeds
    feeds = sorted(tmp_path.glob("hosted_members-*.jsonl"))  # one per process
    statuses: dict[str, Counter[int]] = {"a": Counter(), "b": Counter()}
    members_per_process = []
    for feed in feeds:
        items = read_items(feed)
        members_per_process.append(len(items))
        for item in items:
            statuses[str(item["tag"])][item["status"]] += 1
    assert statuses == {"a": Counter({200: pages}), "b": Counter({403: pages})}
    assert len(feeds) == 2 and min(members_per_process) > 0, members_per_process


def items_by_tag(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Every feed's items (one file per worker process), by their job's tag."""
    found: dict[str, list[dict[str, Any]]] = {}
    for feed in sorted(folder.glob("hosted_members_local-*.jsonl")):
        for item in read_items(feed):
            found.setdefault(str(item["tag"]), []).append(item)
    return found


def test_each_hosted_job_has_its_own_jar_without_cookies_shared(
    app: Celery, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    """Scrapy's in-process jars, per job: each job starts with an empty jar, as a
    ``scrapy crawl`` run does.

    One process serves all three jobs. Jobs "alice" and "bob" log in as two
    users; both are queued before the worker starts, so that their logins and
    member pages are fetched at the same time. Job "nologin", run next in the
    same process, never logs in: its member pages must be refused.
    """
    pages = 20
    with serve(StaticSite(pages=pages)) as site:
        seed = {"site": site.url, "pages": pages, "login": True}
        users = [
            crawl_job("hosted_members_local", [{**seed, "tag": user, "user": user}], app=app)
            for user in ("alice", "bob")
        ]
        worker = start_worker("w1", pool="solo")
        assert [job.wait(timeout=120)["state"] for job in users] == ["done", "done"]
        nologin = {**seed, "tag": "nologin", "login": False}
        assert crawl_job("hosted_members_local", [nologin], app=app).wait(120)["state"] == "done"
        assert site.hits["/login"] == 2
    assert worker.stop() == 0  # closes the feed
    found = items_by_tag(tmp_path)
    whose = {tag: Counter((i["status"], i["user"]) for i in items) for tag, items in found.items()}
    assert whose == {
        "alice": Counter({(200, "alice"): pages}),
        "bob": Counter({(200, "bob"): pages}),
        "nologin": Counter({(403, None): pages}),
    }
