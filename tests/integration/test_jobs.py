"""Jobs end to end: real Celery worker processes host the crawlers (no eager mode)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_crawl import crawl, create_app
from celery_crawl.core.keys import job_spider
from celery_crawl.demo.site import SiteConfig, run_in_thread
from celery_crawl.hosting.project import project_of
from tests.support import ROOT
from tests.support.forum import FORUM, assert_complete_forum_crawl, forum_seeds
from tests.support.paths_spider import EXPECTED_ITEMS, KINDS, PathsSite
from tests.support.workers import WORKER_APP, WORKER_SETTINGS, Worker, run_module, start_process


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_two_jobs_in_a_row_in_one_worker_process(
    app: Celery, start_worker: Callable[..., Worker], db_url: str, pool: str
) -> None:
    worker = start_worker(pool=pool)
    first = crawl("forum", forum_seeds(), app=app).wait(timeout=120)
    assert_complete_forum_crawl(first)
    redis.Redis.from_url(db_url).flushdb()  # forget dedup: crawl the same pages again
    second = crawl("forum", forum_seeds(), app=app).wait(timeout=120)
    assert_complete_forum_crawl(second)
    assert "ReactorNotRestartable" not in worker.output()
    assert worker.output().count("hosting crawlers") == 1  # one process, one reactor
    assert len(frozen_heaps(worker)) == 1  # frozen once, after the crawlers opened
    assert gc_thresholds(worker) == ["5000, 20, 10"]  # the default, read back from gc


def gc_thresholds(worker: Worker) -> list[str]:
    """The GC thresholds each of the worker's processes reported after setting them."""
    return re.findall(r"GC thresholds set to ([\d, ]+\d)", worker.output())


def frozen_heaps(worker: Worker) -> list[int]:
    """How many objects each of the worker's processes froze out of the GC (CrawlerHost.start)."""
    counts = [int(n) for n in re.findall(r"(\d+) startup objects frozen", worker.output())]
    assert all(n > 10_000 for n in counts)  # modules, the app, the crawlers: not a token freeze
    return counts


def test_the_gc_freeze_can_be_turned_off(app: Celery, env: dict[str, str], tmp_path: Path) -> None:
    settings = {**env, "CELERY_CRAWL_GC_FREEZE": "false", "CELERY_CRAWL_GC_THRESHOLD": "3000,15"}
    worker = Worker("nofreeze", settings, tmp_path / "nofreeze.log", pool="solo")
    try:
        worker.wait_ready()
        assert crawl("paths", [{"chain": "r", "length": 2}], app=app).wait(timeout=60)["pages"] == 2
    finally:
        worker.stop()
    assert worker.output().count("hosting crawlers") == 1
    assert frozen_heaps(worker) == []
    assert gc_thresholds(worker) == ["3000, 15, 10"]  # the third one stays Python's


def test_a_malformed_gc_threshold_stops_the_worker(env: dict[str, str], tmp_path: Path) -> None:
    settings = {**env, "CELERY_CRAWL_GC_THRESHOLD": "5000,0"}  # 0 would turn the GC off
    worker = Worker("badgc", settings, tmp_path / "badgc.log", pool="solo")
    try:
        code = worker.proc.wait(60)
    finally:
        worker.stop()
    assert code == 78
    assert "CELERY_CRAWL_GC_THRESHOLD = ['5000', '0']: give 1 to 3 positive" in worker.output()
    assert gc_thresholds(worker) == []


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_worker_whose_crawlers_cannot_open_stops(
    app: Celery, env: dict[str, str], db_url: str, tmp_path: Path, pool: str
) -> None:
    """Not a worker that takes job tasks and crawls nothing: it logs why, and exits."""
    keys = project_of(app).keys("forum")
    redis.Redis.from_url(db_url).set(keys.dupefilter + ":kind", "bloom")  # another class's filter
    worker = Worker("broken", env, tmp_path / "broken.log", pool=pool)
    try:
        code = worker.proc.wait(60)
    finally:
        worker.stop()
    # solo: EX_CONFIG. prefork: the warm shutdown the child asked for (0), unless the
    # parent first finds that its pool could not start (1)
    assert code == 78 if pool == "solo" else code in {0, 1}
    output = worker.output()
    assert "the crawlers could not open, so this worker stops" in output
    assert "is of kind 'bloom', but DUPEFILTER_CLASS is RFPDupeFilter" in output


def test_crawl_wait_returns_the_statistics(
    app: Celery, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    worker = start_worker()
    job = crawl("forum", forum_seeds(), app=app)
    result = job.wait(timeout=120)
    assert_complete_forum_crawl(result)
    assert result["duration"] > 0
    assert job.result.get(timeout=30) == result  # the Celery task returns the same
    assert_kept_a_week(app, job.id)
    assert len(frozen_heaps(worker)) == 2  # each prefork child froze its own heap
    assert worker.stop() == 0  # closes the feeds
    lines = [line for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert len(lines) == result["items"]
    assert len({line for line in lines}) == len(lines)


def assert_kept_a_week(app: Celery, job_id: str) -> None:
    """The finished job's hash, index entry and Celery result expire together, in a week."""
    project, client = project_of(app), redis.Redis.from_url(app.conf.broker_url)
    keys = [
        project.keys("forum").job(job_id),
        job_spider(project.prefix, job_id),
        f"celery-task-meta-{job_id}",
    ]
    week = 7 * 24 * 3600
    assert all(week - 60 < client.ttl(key) <= week for key in keys), [client.ttl(k) for k in keys]


def test_every_request_path_counts_as_processed(
    app: Celery, start_worker: Callable[..., Worker], paths_site: PathsSite
) -> None:
    start_worker()
    job = crawl("paths", [{"path": kind} for kind in KINDS], app=app)
    result = job.wait(timeout=120)
    hits = dict(paths_site.hits)
    # done exactly at the end: the slow page's child had been crawled already
    assert hits.get("/ok/after-slow") == 1
    assert result["items"] == EXPECTED_ITEMS
    assert hits["/always500"] == 3 and hits["/flaky"] == 2  # retried, then given up / fixed
    assert hits["/ok/from-errback"] == 1 and hits["/ok/r"] == 1 and hits["/ok/child"] == 1
    assert "/drop" not in hits
    assert result["retries"] >= 3
    assert result["errors"].get("ValueError") == 1  # the raising callback
    assert result["errors"].get("DownloadConnectionRefusedError") == 3  # a try and 2 retries
    assert result["errors"].get("IgnoreRequest") == 1  # the request a middleware dropped
    assert result["status_codes"]["404"] == 1
    assert result["queued"] == result["in_flight"] == 0


def test_cancel_purges_only_that_job(app: Celery, start_worker: Callable[..., Worker]) -> None:
    slow = crawl("paths", [{"path": "slow"}, {"path": "ok"}], app=app)
    forum = crawl("forum", forum_seeds(), app=app)
    assert forum.status().queued == len(FORUM.forum_ids())
    purged = forum.cancel()
    assert purged == len(FORUM.forum_ids())
    cancelled = forum.status()
    assert cancelled.state == "cancelled" and cancelled.queued == 0
    start_worker()
    assert forum.wait(timeout=30)["state"] == "cancelled"
    assert slow.wait(timeout=120)["items"] == 4  # slow, after-slow, ok, ok/child


def test_a_redelivered_job_task_joins_its_job(
    app: Celery, start_worker: Callable[..., Worker]
) -> None:
    job = crawl("forum", forum_seeds(), app=app)
    again = app.send_task(  # what a redelivery after the visibility timeout looks like
        "celery_crawl.crawl", args=("forum", forum_seeds()), task_id=job.id
    )
    start_worker()
    result = job.wait(timeout=120)
    assert_complete_forum_crawl(result)  # seeds were not enqueued twice
    assert again.get(timeout=30)["pages"] == result["pages"]


def test_bad_input_fails_at_crawl_time(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    from celery_crawl.core.errors import RedisUnavailable
    from celery_crawl.hosting.project import BadSeed, UnknownSpider

    with pytest.raises(UnknownSpider, match=r"'nope'.*forum"):
        crawl("nope", [{"forum_id": "00001"}], app=app)
    with pytest.raises(BadSeed, match="forum_id"):
        crawl("forum", [{"forum": "x"}], app=app)
    with pytest.raises(BadSeed, match="start\\(\\) yields no request; give the job seeds"):
        crawl("paths", [], app=app)  # no seeds: the spider's start(), and it has none
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    unreachable = create_app("worker_app", WORKER_SETTINGS)
    started = time.monotonic()
    with pytest.raises(RedisUnavailable, match=r"127\.0\.0\.1:1"):
        crawl("forum", [{"forum_id": "00001"}], app=unreachable)
    assert time.monotonic() - started < 30


def test_kill_9_of_one_of_two_workers_loses_nothing(
    app: Celery, start_worker: Callable[..., Worker], forum_site: Any, tmp_path: Path
) -> None:
    victim, survivor = start_worker("victim"), start_worker("survivor")
    job = crawl("forum", forum_seeds(), app=app)
    deadline = time.monotonic() + 60
    while job.status().pages < 40 and time.monotonic() < deadline:
        time.sleep(0.02)
    victim.signal(signal.SIGKILL)
    result = job.wait(timeout=180)
    assert_complete_forum_crawl_pages(result, forum_site)
    # the pages the victim held, fetched twice, counted once: their stats went with the acks
    doubles = [path for path, count in forum_site.site.requests_by_path.items() if count > 1]
    assert_complete_forum_crawl(result, f"fetched twice: {len(doubles)}")
    assert survivor.proc.poll() is None
    assert survivor.stop() == 0  # its feed files are stored as it stops; the victim's are not
    expected = FORUM.expected()
    found = feed_item_ids(sorted(tmp_path.glob("forum*.jsonl")))  # FORUM_FEED: one per process
    items = expected.posts + expected.comments
    assert len(found) == items, f"{items - len(found)} of {items} items in no feed file"


def feed_item_ids(parts: list[Path]) -> set[str]:
    """The posts and comments in the feed files; a killed worker's cut last line is skipped."""
    ids = set()
    for part in parts:
        *complete, _cut = part.read_text().split("\n")
        for item in map(json.loads, complete):
            ids.add(item["comment_id"] if item["type"] == "comment" else item["post_id"])
    return ids


def assert_complete_forum_crawl_pages(result: dict[str, Any], site: Any) -> None:
    expected = FORUM.expected()
    assert result["state"] == "done"
    served = site.site.requests_by_path
    assert len(served) == expected.pages + expected.not_found  # 100% of the pages
    doubles = [path for path, count in served.items() if count > 1]
    assert all(served[path] == 2 for path in doubles)
    # only what the killed worker held: 2 processes x (32 downloading + 16 prefetched)
    assert len(doubles) <= 2 * (32 + 16)


def test_sigterm_mid_crawl_loses_nothing(
    app: Celery, start_worker: Callable[..., Worker], forum_site: Any
) -> None:
    stopping, staying = start_worker("stopping"), start_worker("staying")
    job = crawl("forum", forum_seeds(), app=app)
    deadline = time.monotonic() + 60
    while job.status().pages < 40 and time.monotonic() < deadline:
        time.sleep(0.02)
    stopping.proc.send_signal(signal.SIGTERM)
    result = job.wait(timeout=180)
    assert stopping.proc.wait(timeout=60) == 0
    served = forum_site.site.requests_by_path
    twice = sorted(path for path, count in served.items() if count > 1)
    assert_complete_forum_crawl(result, f"fetched more than once: {len(twice)} {twice[:5]}")
    assert len(served) == FORUM.expected().pages + FORUM.expected().not_found
    assert staying.proc.poll() is None


def test_a_warm_shutdown_while_the_engines_start_closes_every_crawler(
    start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    """A prefork child told to exit as soon as it is up: its spiders are open, their engines
    not yet running. Scrapy's ``Crawler.stop`` would drop the stop and the engine would run
    on, holding leases nobody hands back; the host waits for each engine, then stops it."""
    from tests.support.worker_settings import CELERY_CRAWL_SPIDERS

    gate = tmp_path / "engines-may-start"  # the engines wait for it (tests/support/slow_start.py)
    worker = start_worker("starting", concurrency=1, extra_env={"ENGINE_START_GATE": str(gate)})
    wait_for_line(worker, "hosting crawlers for")
    worker.proc.send_signal(signal.SIGTERM)
    wait_for_line(worker, "is still starting: it stops once its engine runs")
    gate.touch()
    assert worker.proc.wait(timeout=60) == 0
    output = worker.output()
    closed = set(re.findall(r"\[(\w+)\] Closing spider \(shutdown\)", output))
    assert closed == set(CELERY_CRAWL_SPIDERS), output[-3000:]
    assert "crawlers did not stop" not in output


def wait_for_line(worker: Worker, text: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while text not in worker.output():
        assert worker.proc.poll() is None, worker.output()[-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in {seconds} s: {worker.output()[-3000:]}"
        time.sleep(0.05)


def test_cli_crawl_waits_and_exits_zero(
    env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    args = ["crawl", "forum", *FORUM.forum_ids(), "--wait", "--json", "-A", WORKER_APP]
    done = run_module("celery_crawl.tools.cli", args, env, timeout=180)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert [r["seeds"] for r in results] == [[{"forum_id": f}] for f in FORUM.forum_ids()]
    assert all(r["state"] == "done" for r in results)
    expected = FORUM.expected()
    assert sum(r["items"] for r in results) == expected.posts + expected.comments
    bad = run_module("celery_crawl.tools.cli", ["crawl", "nope", "1", "-A", WORKER_APP], env, 60)
    assert bad.returncode == 2 and "unknown spider 'nope'" in bad.stderr


def test_pickup_latency_is_measured(
    app: Celery,
    start_worker: Callable[..., Worker],
    paths_site: PathsSite,
    record_property: Callable[[str, object], None],
) -> None:
    """From crawl() returning to the site seeing the request, on an idle worker.

    The 50 ms target is checked by ``benchmarks.e2e``, not here: tests are not timed.
    """
    import statistics

    start_worker()
    crawl("paths", [{"probe": "warm-up"}], app=app).wait(timeout=60)
    samples = []
    for number in range(10):
        time.sleep(0.3)  # the worker is idle again, blocked on its wake-up list
        started = time.monotonic()
        job = crawl("paths", [{"probe": str(number)}], app=app)
        assert job.wait(timeout=60)["pages"] == 1
        samples.append(paths_site.first_hit[f"/ok/probe-{number}"] - started)
    median_ms = statistics.median(samples) * 1000
    record_property("pickup_latency_median_ms", round(median_ms, 1))
    print(f"\npickup latency: median {median_ms:.1f} ms, max {max(samples) * 1000:.1f} ms")
    assert len(samples) == 10 and all(s > 0 for s in samples)


def test_app_settings_overlay_the_scrapy_settings(env: dict[str, str]) -> None:
    from celery_crawl.hosting.project import project_of

    app = create_app("worker_app", WORKER_SETTINGS, settings={"CONCURRENT_REQUESTS": 7})
    settings = project_of(app).settings
    assert settings.getint("CONCURRENT_REQUESTS") == 7
    assert settings.get("REDIS_URL") == env["REDIS_URL"]  # the environment still wins
    assert app.conf.broker_url == env["REDIS_URL"] and app.conf.task_serializer == "json"
    assert app.conf.accept_content == ["json"]


def test_celery_beat_produces_a_job_per_forum(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    forum_site: Any,
    prefix: str,
    db_url: str,
    tmp_path: Path,
) -> None:
    """A real ``celery beat`` runs the producer; a real worker crawls what it produces."""
    from celery_crawl.core.keys import SpiderKeys

    start_worker()
    args = ["-A", WORKER_APP, "beat", "--loglevel", "INFO"]
    args += ["--schedule", str(tmp_path / "beat-schedule")]
    beat = start_process("celery", args, {**env, "PRODUCER_PERIOD": "1"}, tmp_path / "beat.log")
    try:
        expected = FORUM.expected()
        client = redis.Redis.from_url(db_url)
        stats_key = SpiderKeys.build("forum", prefix=prefix).stats
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            produced = int(client.hget(stats_key, "producer/produced") or 0)
            # every page, counted once: beat's next rounds fetch list pages again meanwhile
            done = len(forum_site.site.requests_by_path) >= expected.pages + expected.not_found
            if produced >= len(FORUM.forum_ids()) and done:
                break
            time.sleep(0.2)
        assert produced >= len(FORUM.forum_ids()), (tmp_path / "beat.log").read_text()[-2000:]
        assert len(forum_site.site.requests_by_path) == expected.pages + expected.not_found
        skipped = int(client.hget(stats_key, "producer/skipped_running") or 0)
        assert produced + skipped >= len(FORUM.forum_ids())
    finally:
        beat.terminate()
        beat.wait(30)


def test_a_faulty_site_is_crawled_with_errors_counted_and_no_stuck_job(
    app: Celery, env: dict[str, str], tmp_path: Path, db_url: str, prefix: str
) -> None:
    """503s and malformed 200s: retried, counted by kind, and the job still finishes."""
    from celery_crawl.core.keys import SpiderKeys

    faulty = SiteConfig(forums=2, posts_per_forum=60, error_rate=0.1, malformed_rate=0.1)
    with run_in_thread(faulty) as site:
        # its random 503s (10%) are retried; at about the overload share, they may slow the
        # site for a while, never pause it (docs/politeness.md)
        faulty_env = {**env, "FORUM_BASE_URL": site.url}
        worker = Worker("faulty", faulty_env, tmp_path / "f.log")
        try:
            worker.wait_ready()
            seeds = [{"forum_id": f} for f in faulty.forum_ids()]
            job = crawl(
                "forum",
                seeds,
                app=create_app(
                    "worker_app", WORKER_SETTINGS, settings={"FORUM_BASE_URL": site.url}
                ),
            )
            result = job.wait(timeout=180)
        finally:
            worker.stop()
    client, counts = redis.Redis.from_url(db_url), Counter[str]()
    for spider in ("forum", "forum_detail"):  # lists, and posts with comments
        stats = client.hgetall(SpiderKeys.build(spider, group="forum", prefix=prefix).stats)
        counts.update({k.decode(): int(v) for k, v in stats.items() if b"malformed" in k})
    expected = faulty.expected()
    assert result["state"] == "done"
    assert counts.get("forum/malformed/json", 0) > 0  # the site did send broken pages
    assert "JSONDecodeError" not in result["errors"]  # handled, not crashed
    assert result["retries"] > 0  # the 503s were retried (a retried 503 is not a response)
    # a page is given up after 2 malformed bodies more, or as a 503 once its retries are
    # spent (by the odds, about 1 in 7,000 pages: a 503 four times, a malformed body between them
    # carrying the count on); either way the job still ends done, with fewer items
    given_up = counts.get("forum/malformed/given_up", 0) + result["status_codes"].get("503", 0)
    if given_up == 0:
        assert result["items"] == expected.posts + expected.comments
    else:
        assert result["items"] < expected.posts + expected.comments


def changed_posts(before: SiteConfig, after: SiteConfig) -> tuple[int, int]:
    """Pages a versioned re-crawl must fetch beyond the list pages: (pages, 404s)."""
    from celery_crawl.demo.site import list_page, post_page

    pages = not_found = 0
    for forum in after.forum_ids():
        for number in range(1, after.max_page() + 1):
            old = {p["post_id"]: p for p in list_page(before, forum, number)["posts"]}  # type: ignore[index]
            for post in list_page(after, forum, number)["posts"]:  # type: ignore[index]
                key = ("comment_count", "last_activity")
                if [post[k] for k in key] == [old[post["post_id"]][k] for k in key]:
                    continue
                full = post_page(after, post["post_id"])
                if full is None:
                    not_found += 1
                else:
                    pages += 1 + full["comment_pages"]
    return pages, not_found


def test_incremental_crawl_fetches_only_what_changed(
    app: Celery, env: dict[str, str], tmp_path: Path
) -> None:
    """Lists always; a post (and its comments) only when its listing shows a change."""
    from tests.support.ports import free_port

    port = free_port()
    first_site = SiteConfig(forums=2, posts_per_forum=40, seed=1)
    grown = SiteConfig(forums=2, posts_per_forum=40, seed=2)  # other comment counts
    url = f"http://127.0.0.1:{port}"
    worker = Worker("incremental", {**env, "FORUM_BASE_URL": url}, tmp_path / "i.log")
    job_app = create_app("worker_app", WORKER_SETTINGS, settings={"FORUM_BASE_URL": url})
    seeds = [{"forum_id": f} for f in first_site.forum_ids()]
    try:
        worker.wait_ready()
        with run_in_thread(first_site, port=port):
            full = crawl("forum", seeds, app=job_app).wait(timeout=120)
            again = crawl("forum", seeds, app=job_app).wait(timeout=120)
        with run_in_thread(grown, port=port):
            changed = crawl("forum", seeds, app=job_app).wait(timeout=120)
    finally:
        worker.stop()
    expected = first_site.expected()
    assert full["pages"] == expected.pages + expected.not_found
    assert again["pages"] == expected.list_pages  # nothing changed: only the lists
    pages, not_found = changed_posts(first_site, grown)
    assert pages > 0
    assert changed["pages"] == expected.list_pages + pages + not_found


def test_a_script_that_starts_a_job_and_exits_prints_no_traceback(env: dict[str, str]) -> None:
    """An ``AsyncResult`` alive at interpreter shutdown prints a traceback from its ``__del__``."""
    script = [sys.executable, "-m", "tests.support.crawl_and_exit"]
    done = subprocess.run(
        script, check=False, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no result yet"
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
