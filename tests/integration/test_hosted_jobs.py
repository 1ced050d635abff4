"""Hosted jobs behave like crawls: live workers, fast lease recovery, limits, start(), dedup scope.

These tests run the workers with the default lease and heartbeat times (the
other integration tests shorten them), against real worker processes.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_crawl import crawl
from celery_crawl.core.defaults import SETTINGS
from celery_crawl.core.errors import ConfigError
from celery_crawl.hosting.project import project_of
from celery_crawl.hosting.registry import Registry
from celery_crawl.jobs.limits import LIMITS
from tests.support import ROOT
from tests.support.paths_spider import PathsSite
from tests.support.ports import free_port
from tests.support.waiting import wait_for
from tests.support.workers import WORKER_APP, Worker, run_module, started_workers

RECOVERY_TARGET = 15.0  # seconds from kill -9 to the dead worker's requests queued again
DEFAULTS = (
    "SCHEDULER_LEASE_SECONDS",
    "SCHEDULER_REQUEUE_INTERVAL",
    "CELERY_CRAWL_HEARTBEAT_SECONDS",
)


@pytest.fixture
def live_env(env: dict[str, str], paths_site: PathsSite) -> dict[str, str]:
    """The workers' environment with the default lease and heartbeat times."""
    return {**env, **{name: str(SETTINGS[name].default) for name in DEFAULTS}}


@pytest.fixture
def workers(live_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Workers with the default lease and heartbeat times; solo, one slot, unless asked."""
    with started_workers(live_env, tmp_path) as start:
        yield functools.partial(start, pool="solo", concurrency=1)


@pytest.mark.alone  # recovery within 15 s
def test_a_killed_workers_leases_are_queued_again_within_15_s(
    app: Celery, workers: Callable[..., Worker], state_client: redis.Redis, paths_site: PathsSite
) -> None:
    inflight = project_of(app).keys("paths").inflight
    victim = workers("victim")
    seeds = [{"sleep": 6, "id": f"kill-{i}"} for i in range(4)]
    job = crawl("paths", seeds, app=app)
    wait_for(lambda: state_client.zcard(inflight) == 4, 30, "the victim leases the 4 requests")
    survivor = workers("survivor")  # registered and beating while the victim holds the leases
    held = state_client.zrange(inflight, 0, -1)
    victim.signal(signal.SIGKILL)
    took = wait_for(
        lambda: not any(state_client.zmscore(inflight, held)),
        60,
        "the killed worker's leases leave the in-flight set",
    )
    print(f"kill -9 to requests queued again: {took:.1f} s")
    assert took <= RECOVERY_TARGET
    result = job.wait(timeout=60)  # the survivor fetches them again
    assert result["state"] == "done" and result["pages"] == 4
    assert {f"/sleep/kill-{i}/6" for i in range(4)} <= set(paths_site.hits)
    assert survivor.proc.poll() is None
    registry = Registry.from_settings(project_of(app).settings)
    wait_for(
        lambda: (
            [w.live for w in registry.read(state_client) if w.hostname.startswith("victim@")]
            == [False]
        ),
        3 * registry.heartbeat + 5,
        "the killed worker shows as lost in the registry",
    )


@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_a_slow_download_and_a_long_callback_are_never_leased_twice(
    app: Celery,
    workers: Callable[..., Worker],
    state_client: redis.Redis,
    paths_site: PathsSite,
    pool: str,
) -> None:
    """A 60 s download, and a callback that holds the reactor for 15 s (longer than a lease).

    Two workers: when a lease lapses, the other takes the request and the site
    sees it twice. Renewing from the reactor would lose the blocked callback's lease.
    """
    workers("one", pool=pool)
    workers("two", pool=pool)
    seeds = [{"sleep": 60, "id": pool}, {"block": 15, "id": pool}]
    result = crawl("paths", seeds, app=app).wait(timeout=150)
    assert result["state"] == "done", result
    assert (result["pages"], result["items"]) == (2, 2), (result, paths_site.hits)
    assert paths_site.hits[f"/sleep/{pool}/60"] == 1
    assert paths_site.hits[f"/ok/block-{pool}"] == 1
    stats = state_client.hgetall(project_of(app).keys("paths").stats)
    assert b"scheduler/requeued/expired" not in stats


def test_a_page_whose_items_take_longer_than_a_lease_to_settle_is_not_leased_twice(
    app: Celery,
    workers: Callable[..., Worker],
    state_client: redis.Redis,
    paths_site: PathsSite,
) -> None:
    """The engine is done with the page, and its ack waits 15 s (longer than a lease) for
    its items to be made durable, in the reactor, as a feed on a slow disk would.

    Two workers: when the lease lapses, the other takes the page and the site sees it
    twice. Before, the lease lapsed at every try: the page was fetched without end.
    """
    workers("one", pool="solo")
    workers("two", pool="solo")
    result = crawl("paths", [{"slow_settle": 15, "id": "settle"}], app=app).wait(timeout=60)
    assert result["state"] == "done", result
    assert (result["pages"], result["items"]) == (1, 1), (result, paths_site.hits)
    assert paths_site.hits["/ok/slow-settle-settle"] == 1
    stats = state_client.hgetall(project_of(app).keys("paths").stats)
    assert b"scheduler/requeued/expired" not in stats


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_module("celery_crawl.tools.cli", [*args, "--app", WORKER_APP], env, timeout)


def test_status_and_the_exporter_list_live_workers_and_waiting_jobs(
    app: Celery, workers: Callable[..., Worker], live_env: dict[str, str]
) -> None:
    job = crawl("paths", [{"probe": "waiting"}], app=app)  # accepted: workers may start later
    waiting = json.loads(cli(live_env, "status", "--json").stdout)
    (paths,) = [s for s in waiting["spiders"] if s["spider"] == "paths"]
    assert [j["waiting"] for j in paths["jobs"]] == ["waiting: no live worker hosts paths"]
    worker = workers("registered")
    assert job.wait(timeout=60)["state"] == "done"
    processes = json.loads(cli(live_env, "status", "--json").stdout)["processes"]
    (entry,) = processes
    assert entry["id"].startswith("registered@") and entry["live"]
    assert "paths" in entry["spiders"] and entry["heartbeat_age"] < 3 * 5.0
    assert entry["pid"] == worker.proc.pid  # solo: the crawlers run in the worker's process
    metrics = exporter_metrics(live_env).splitlines()
    assert 'celery_crawl_live_workers{spider="paths"} 1.0' in metrics
    (age,) = [m for m in metrics if m.startswith("celery_crawl_worker_heartbeat_age_seconds{")]
    assert f'worker="{entry["id"]}"' in age and float(age.rsplit(" ", 1)[1]) < 3 * 5.0
    worker.stop()
    assert json.loads(cli(live_env, "status", "--json").stdout)["processes"] == []  # left cleanly


def exporter_metrics(env: dict[str, str]) -> str:
    port = free_port()
    command = [sys.executable, "-m", "celery_crawl.tools.cli", "exporter", "--app", WORKER_APP]
    proc = subprocess.Popen([*command, "--port", str(port)], env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return str(r.read().decode())
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(10)


def test_crawl_follows_a_waiting_job_and_refuses_a_spider_no_worker_may_host(
    app: Celery, live_env: dict[str, str]
) -> None:
    with pytest.raises(ConfigError, match="no worker may host spider 'kind_sitemap'"):
        crawl("kind_sitemap", ["http://127.0.0.1:1/"], app=app)
    followed = cli(live_env, "crawl", "paths", '{"probe": "cli"}', "--wait", "--timeout", "3")
    assert "waiting: no live worker hosts paths" in followed.stderr
    assert followed.returncode == 1  # not done within the timeout: nothing runs it


def test_a_job_ends_at_its_page_limit_and_the_next_job_of_the_spider_crawls_fully(
    app: Celery, workers: Callable[..., Worker], state_client: redis.Redis
) -> None:
    """CLOSESPIDER_PAGECOUNT's meaning, per job: the job ends, the hosted crawler stays."""
    worker = workers("limited", pool="prefork", concurrency=1)
    limited = crawl("paths", [{"chain": "limited", "length": 8}], app=app, limits={"pages": 3})
    result = limited.wait(timeout=60)
    assert result["state"] == "closed" and result["reason"] == "closespider_pagecount"
    assert 3 <= result["pages"] < 8
    assert result["limits"] == {"pages": 3.0}
    after = crawl("paths", [{"chain": "after-limit", "length": 4}], app=app).wait(timeout=60)
    assert after["state"] == "done" and after["pages"] == 4
    log = worker.output()
    assert "crawler paths stopped" not in log and "closed while hosted" not in log
    queue = project_of(app).keys("paths").queue
    wait_for(lambda: state_client.zcard(queue) == 0, 10, "nothing of the closed job left queued")


def test_close_spider_in_a_callback_ends_that_job_only(
    app: Celery, workers: Callable[..., Worker]
) -> None:
    worker = workers("closing")
    other = crawl("paths", [{"chain": "beside-close", "length": 6}], app=app)
    closed = crawl("paths", [{"close": "a"}], app=app).wait(timeout=60)
    assert closed["state"] == "closed" and closed["reason"] == "enough for this job"
    assert closed["items"] == 1 and closed["pages"] == 1
    assert other.wait(timeout=60)["state"] == "done"  # the other job of the spider went on
    assert "crawler paths stopped" not in worker.output()


def test_a_hosted_crawler_that_closes_anyway_is_opened_again(
    app: Celery, workers: Callable[..., Worker]
) -> None:
    """An extension (here, a callback) closes the whole crawler: the next job still crawls."""
    worker = workers("reopening")
    stopped = crawl("paths", [{"stop_crawler": "x"}], app=app).wait(timeout=60)
    assert stopped["state"] == "done" and stopped["pages"] == 1
    wait_for(lambda: "crawler paths open again" in worker.output(), 30, "the crawler reopened")
    after = crawl("paths", [{"chain": "after-reopen", "length": 3}], app=app).wait(timeout=60)
    assert after["state"] == "done" and after["pages"] == 3
    assert worker.proc.poll() is None
    assert "crawler paths closed while hosted (closed); opening it again" in worker.output()


@pytest.mark.alone  # a job's duration within bounds
def test_the_time_limit_closes_a_job(app: Celery, workers: Callable[..., Worker]) -> None:
    workers("timed")
    result = crawl("paths", [{"chain": "timed", "length": 40}], app=app, limits={"seconds": 2})
    ended = result.wait(timeout=60)
    assert ended["state"] == "closed" and ended["reason"] == "closespider_timeout"
    assert 2 <= ended["duration"] < 10 and ended["pages"] < 40


@pytest.fixture
def skewed_workers(live_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[[float], Worker]]:
    """``start(skew)``: a solo worker whose Python clock (``time.time``) is ``skew`` s off."""
    clock = str(ROOT / "tests" / "support" / "skewed_clock")
    with started_workers(live_env, tmp_path) as start:

        def skewed(skew: float) -> Worker:
            live_env["PYTHONPATH"] = f"{clock}{os.pathsep}{live_env['PYTHONPATH']}"
            live_env["TEST_CLOCK_SKEW_SECONDS"] = str(skew)
            return start(f"skew{skew:+.0f}", pool="solo", concurrency=1)

        yield skewed


def worker_clock_skew(app: Celery, client: redis.Redis) -> float:
    """How far the one registered worker's ``time.time`` was from the test's at its start."""
    (entry,) = client.zrange(Registry.from_settings(project_of(app).settings).key, 0, -1)
    return float(json.loads(entry)["started"]) - time.time()


@pytest.mark.alone  # a job's duration within bounds
def test_a_worker_clock_30_s_ahead_does_not_close_a_20_s_job_early(
    app: Celery, skewed_workers: Callable[[float], Worker], state_client: redis.Redis
) -> None:
    """Before the job's clock was Redis's, it was closed after about 2 s."""
    skewed_workers(30)
    assert 25 < worker_clock_skew(app, state_client) < 35  # the hook took
    job = crawl("paths", [{"chain": "ahead", "length": 60}], app=app, limits={"seconds": 20})
    crawled = lambda: (s := job.status()).pages >= 8 or s.finished  # noqa: E731
    wait_for(crawled, 30, "the worker crawls 8 pages (about 4 s), or the job ends")
    status = job.status()
    assert (status.state, status.reason) == ("running", "")
    assert 3 < status.duration < 20
    job.cancel()
    assert job.wait(timeout=60)["state"] == "cancelled"


@pytest.mark.alone  # a job's duration within bounds
def test_a_worker_clock_30_s_behind_closes_a_2_s_job_on_time(
    app: Celery, skewed_workers: Callable[[float], Worker], state_client: redis.Redis
) -> None:
    """Before the job's clock was Redis's, it was closed after about 32 s."""
    skewed_workers(-30)
    assert -35 < worker_clock_skew(app, state_client) < -25
    job = crawl("paths", [{"chain": "behind", "length": 60}], app=app, limits={"seconds": 2})
    ended = job.wait(timeout=20)
    assert ended["state"] == "closed" and ended["reason"] == "closespider_timeout"
    assert 2 <= ended["duration"] < 10


def test_the_cli_takes_job_limits(live_env: dict[str, str], workers: Callable[..., Worker]) -> None:
    workers("cli-limits")
    args = ("crawl", "paths", '{"chain": "cli", "length": 8}', "--limit", "pages=2", "--wait")
    done = cli(live_env, *args, "--json")
    assert done.stdout, done.stderr
    (result,) = json.loads(done.stdout)
    assert result["state"] == "closed" and result["reason"] == "closespider_pagecount"
    assert done.returncode == 1  # not done: closed early
    bad = cli(live_env, "crawl", "paths", '{"probe": "x"}', "--limit", "width=2")
    assert bad.returncode == 2
    assert f"the limits are {', '.join(LIMITS)}" in bad.stderr


def test_a_jobs_depth_limit_holds_for_that_job_only(
    app: Celery, workers: Callable[..., Worker], paths_site: PathsSite
) -> None:
    """Two jobs of one spider at once on one worker: depths 0 to 2 (7 pages), and all 31."""
    workers("depth")
    shallow = crawl("paths", [{"tree": "shallow"}], app=app, limits={"depth": 2})
    deep = crawl("paths", [{"tree": "deep"}], app=app)
    assert shallow.wait(timeout=60)["pages"] == 7
    assert deep.wait(timeout=60)["pages"] == 31
    assert {p for p in paths_site.hits if p.startswith("/tree/shallow/")} == {
        f"/tree/shallow/{node}" for node in ("r", "ra", "rb", "raa", "rab", "rba", "rbb")
    }


def test_the_error_count_limit_closes_a_job(app: Celery, workers: Callable[..., Worker]) -> None:
    """CLOSESPIDER_ERRORCOUNT's meaning: callback errors; the slow chain is cut short."""
    workers("errors")
    seeds = [{"path": "raise"}, {"chain": "errors", "length": 20}]
    ended = crawl("paths", seeds, app=app, limits={"errors": 1}).wait(timeout=60)
    assert ended["state"] == "closed" and ended["reason"] == "closespider_errorcount"
    assert ended["errors"]["ValueError"] == 1 and ended["pages"] < 10


def test_a_worker_crawls_nothing_at_start_and_a_job_without_seeds_runs_start(
    app: Celery, workers: Callable[..., Worker], live_env: dict[str, str], paths_site: PathsSite
) -> None:
    """Hosted spiders' start() runs only as a job; each such job crawls start_urls again."""
    worker = workers("starting", pool="prefork", concurrency=2)
    skipped = "hosted spider paths_start: its start requests run only as a job"
    # both processes came where a crawl of its own would start, and started none
    wait_for(lambda: worker.output().count(skipped) >= 2, 60, "both processes past start()")
    time.sleep(2)  # what a worker would crawl on its own, it would have asked for by now
    assert not [path for path in paths_site.hits if path.startswith("/ok/start-")]
    first = crawl("paths_start", [], app=app).wait(timeout=60)
    assert first["state"] == "done" and (first["pages"], first["items"]) == (3, 3)
    again = cli(live_env, "crawl", "paths_start", "--wait", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)[0]["pages"] == 3
    assert all(paths_site.hits[f"/ok/start-{n}"] == 2 for n in range(3))


def test_a_job_run_again_crawls_again_and_two_jobs_on_one_seed_both_crawl_fully(
    app: Celery, workers: Callable[..., Worker]
) -> None:
    """The default dedup scope is the job: /ok and its child, in every job."""
    workers("scoped", pool="prefork", concurrency=2)
    for _ in range(2):
        assert crawl("paths", [{"path": "ok"}], app=app).wait(timeout=60)["pages"] == 2
    together = [crawl("paths", [{"path": "ok"}], app=app) for _ in range(2)]
    assert [job.wait(timeout=60)["pages"] for job in together] == [2, 2]


def test_the_dedup_command_inspects_and_resets_a_spider_wide_filter(
    app: Celery, workers: Callable[..., Worker], live_env: dict[str, str]
) -> None:
    """The forum spider opts into spider-wide dedup: incremental until the filter is reset."""
    workers("incremental")
    first = crawl("forum", [{"forum_id": "00001"}], app=app).wait(timeout=120)
    again = crawl("forum", [{"forum_id": "00001"}], app=app).wait(timeout=120)
    assert again["pages"] < first["pages"] / 2  # only the list pages: every post was seen
    # the posts and comment pages go to forum_detail, the group's other spider, and its filter
    shown = json.loads(cli(live_env, "dedup", "forum_detail", "--json").stdout)
    assert shown["scope"] == "spider" and shown["kind"] == "exact"
    assert shown["fingerprints"] >= first["pages"] - again["pages"]
    reset = cli(live_env, "dedup", "forum_detail", "--reset")
    assert reset.returncode == 0 and "every fingerprint forgotten" in reset.stdout
    emptied = json.loads(cli(live_env, "dedup", "forum_detail", "--json").stdout)
    assert emptied["fingerprints"] == 0
    after = crawl("forum", [{"forum_id": "00001"}], app=app).wait(timeout=120)
    assert after["pages"] == first["pages"]


def test_spider_arguments_reach_the_seed_spider_and_every_callback_of_the_job(
    app: Celery, workers: Callable[..., Worker], live_env: dict[str, str], paths_site: PathsSite
) -> None:
    workers("arguments", pool="prefork", concurrency=2)
    args = {"category": "news", "suffix": "-x"}
    result = crawl("paths", [{"args": "a"}], app=app, args=args).wait(timeout=60)
    assert result["state"] == "done" and result["pages"] == 3
    assert result["args"] == args
    assert "/ok/args-a-x/child-news/grandchild-news" in paths_site.hits  # two levels down
    followed = cli(live_env, "crawl", "paths", '{"args": "b"}', "-a", "category=sport", "--wait")
    assert followed.returncode == 0, followed.stderr
    assert "/ok/args-b/child-sport/grandchild-sport" in paths_site.hits
    other = crawl("paths", [{"args": "c"}], app=app).wait(timeout=60)  # no arguments: none leak
    assert other["pages"] == 3 and "/ok/args-c/child-none/grandchild-none" in paths_site.hits
    bad = cli(live_env, "crawl", "paths", '{"probe": "x"}', "-a", "no-equals-sign")
    assert bad.returncode == 2 and "a spider argument is NAME=VALUE" in bad.stderr
