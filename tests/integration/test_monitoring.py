"""The exporter, the alert rules and `celery-crawl status`, against real workers and Redis."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from celery import Celery

from celery_crawl import crawl
from celery_crawl.core.entries import Entry
from celery_crawl.core.keys import SpiderKeys, workers_key
from celery_crawl.hosting.project import project_of
from celery_crawl.hosting.registry import Registry
from celery_crawl.producer.schedule import Schedule, Source
from celery_crawl.queue.queues import PriorityQueue
from celery_crawl.tools.exporter import CrawlCollector, serve
from tests.support import ROOT
from tests.support.debian_tools import debian_tool
from tests.support.forum import assert_complete_forum_crawl, forum_seeds
from tests.support.metrics import scrape, total
from tests.support.ports import free_port
from tests.support.workers import WORKER_APP, Worker, run_module

SPIDERS = ("forum", "forum_detail")


def test_exporter_metrics_match_the_stats_the_job_reported(
    app: Celery, start_worker: Callable[..., Worker], db_url: str
) -> None:
    worker = start_worker(pool="solo")
    result = crawl("forum", forum_seeds(), app=app).wait(timeout=120)
    assert_complete_forum_crawl(result)
    assert worker.stop() == 0  # the last stats are flushed at close
    project = project_of(app)
    metrics = scrape(redis.Redis.from_url(db_url), [project.keys(s) for s in SPIDERS])

    assert total(metrics, "celery_crawl_items_total") == result["items"]
    for status, count in result["status_codes"].items():
        assert total(metrics, "celery_crawl_responses_total", status=status) == count
    assert total(metrics, "celery_crawl_jobs_finished_total", state="done") == 1
    assert total(metrics, "celery_crawl_jobs", state="running") == 0
    assert total(metrics, "celery_crawl_queue_length") == 0
    assert total(metrics, "celery_crawl_in_flight") == 0
    fetched_urls = result["pages"] - result["status_codes"].get("404", 0)
    assert total(metrics, "celery_crawl_dedup_fingerprints") >= fetched_urls - 9  # lists unfiltered
    assert total(metrics, "celery_crawl_response_bytes_total") > 0
    ages = [v for (n, _), v in metrics.items() if n == "celery_crawl_last_response_age_seconds"]
    assert len(ages) == 2 and all(0 <= age < 120 for age in ages)


def server_commands(client: redis.Redis, action: Callable[[], object]) -> list[str]:
    """The commands the server ran during ``action`` (MONITOR: scripts' inner calls too)."""
    marker = "end-of-scrape-marker"
    monitor = client.monitor()  # a connection of its own
    with monitor as m:
        action()
        client.echo(marker)
        seen: list[str] = []
        for _ in range(10_000):
            command = m.next_command()["command"]
            if marker in command:
                return seen
            if not command.startswith(("HELLO", "CLIENT", "PING")):  # connection upkeep
                seen.append(command)
    raise AssertionError("marker never seen")


def test_a_scrape_costs_the_same_commands_whatever_the_queue_length(
    client: redis.Redis, prefix: str
) -> None:
    keys = [SpiderKeys.build(s, group="forum", prefix=prefix) for s in SPIDERS]
    queue = PriorityQueue(client, keys[1])
    collector = CrawlCollector(client, keys)
    list(collector.collect())  # the first scrape also loads the script
    runs = []
    for size in (10, 5_000):
        queue.push_many([Entry(f"r{i}".encode(), priority=i % 3) for i in range(size)])
        runs.append(server_commands(client, lambda: list(collector.collect())))
    assert len(runs[0]) == len(runs[1]), runs
    # a handful per spider, incl. the script's own calls (it checks the type of each key it
    # reads, each priority level's list among them, before reading: 3 levels here); and
    # INFO memory and stats, once
    assert len(runs[0]) <= 20 * len(keys) + 2, "\n".join(runs[0])


def exporter_names(client: redis.Redis, prefix: str) -> set[str]:
    """Every sample name the exporter emits (stats of every kind present)."""
    keys = SpiderKeys.build("forum", prefix=prefix)
    fields = {
        "downloader/response_status_count/200": 1,
        "downloader/exception_type_count/TimeoutError": 1,
        "celery_crawl/dead_letter/bad_record": 1,
        "scheduler/dropped/unserializable": 1,
        "celery_crawl/last_response_time": 1,
    }
    client.hset(keys.stats, mapping=fields)
    client.hset(keys.job_states, mapping={"running": 1, "done": 1})
    site = {"leased": 3, "parked": 2, "backoffs": 1, "paused_ms": 2000, "delay": 250}
    client.hset(keys.site("forum.example"), mapping=site)
    client.sadd(keys.site_known, "forum.example")
    registry = Registry(workers_key(prefix), 5.0)
    collector = CrawlCollector(client, [keys], registry)
    return {s.name for f in collector.collect() for s in f.samples}


def test_the_exporter_serves_each_sites_state(client: redis.Redis, prefix: str) -> None:
    keys = SpiderKeys.build("forum", prefix=prefix)
    now_ms = int(time.time() * 1000)
    state = {"leased": 40, "parked": 7, "backoffs": 2, "paused_ms": 3000, "until": now_ms + 30_000}
    client.hset(keys.site("forum.example"), mapping=state)
    client.zadd(keys.site_leases("forum.example"), {b"lease-1": now_ms + 60_000})
    client.sadd(keys.site_known, "forum.example")
    samples = {
        (s.name, s.labels.get("site")): s.value
        for f in CrawlCollector(client, [keys]).collect()
        for s in f.samples
    }
    assert samples[("celery_crawl_site_leased_total", "forum.example")] == 40
    assert samples[("celery_crawl_site_parked_total", "forum.example")] == 7
    assert samples[("celery_crawl_site_backoffs_total", "forum.example")] == 2
    assert samples[("celery_crawl_site_paused_seconds_total", "forum.example")] == 3.0
    assert samples[("celery_crawl_site_in_flight", "forum.example")] == 1
    assert 28 < samples[("celery_crawl_site_pause_remaining_seconds", "forum.example")] <= 30


def test_the_exporter_shows_sources_overdue_and_how_long_the_oldest_waited(
    client: redis.Redis, prefix: str
) -> None:
    keys = SpiderKeys.build("forum", prefix=prefix)
    schedule = Schedule(client, keys)
    for name in ("late", "later", "on_time", "waiting"):
        schedule.put(Source(name, seeds=[name], interval=60))
    now_ms = int(time.time() * 1000)
    client.zadd(keys.schedule_due, {"late": now_ms - 90_000, "later": now_ms - 30_000})
    client.zadd(keys.schedule_due, {"on_time": now_ms + 60_000})
    schedule.pause("waiting")
    samples = {s.name: s.value for f in CrawlCollector(client, [keys]).collect() for s in f.samples}
    assert samples["celery_crawl_sources"] == 4
    assert samples["celery_crawl_sources_overdue"] == 2
    assert 90 <= samples["celery_crawl_sources_oldest_overdue_seconds"] < 100


def test_alert_rules_are_valid_and_name_only_exported_metrics(
    client: redis.Redis, prefix: str
) -> None:
    rules = yaml.safe_load((ROOT / "monitoring/prometheus/rules.yml").read_text())
    names = exporter_names(client, prefix)
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {a["alert"] for a in alerts} >= {
        "CrawlItemRateLow",
        "CrawlQueueStuckAtCap",
        "CrawlLeasesExpiring",
        "CrawlNoPageFetched",
        "CrawlJobsFailing",
        "CrawlRequestsDropped",
        "CrawlNoLiveWorker",
        "CrawlSitePaused",
        "CrawlSiteBackingOff",
        "CrawlRedisOutOfMemory",
        "CrawlRedisEvictingKeys",
        "CrawlSourcesOverdue",
    }
    for alert in alerts:
        assert set(alert) <= {"alert", "expr", "for", "labels", "annotations"}
        assert re.fullmatch(r"\d+[smh]", alert["for"]), alert["alert"]
        used = set(re.findall(r"celery_crawl_[a-z_]+", alert["expr"]))
        assert used and used <= names, (alert["alert"], used - names)
        assert alert["expr"].count("(") == alert["expr"].count(")")


def test_promtool_checks_the_rules_and_their_unit_tests() -> None:
    """Each alert fires on the series meant to trigger it (monitoring/prometheus/rules_test.yml)."""
    promtool = debian_tool("promtool", "prometheus")
    folder = ROOT / "monitoring/prometheus"
    for args in (["check", "rules", "rules.yml"], ["test", "rules", "rules_test.yml"]):
        run = subprocess.run(
            [promtool, *args], check=False, cwd=folder, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stdout + run.stderr


def prometheus_api(port: int, path: str, **query: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())["data"]


def test_real_prometheus_scrapes_the_exporter_and_evaluates_every_rule(
    client: redis.Redis, prefix: str, tmp_path: Path
) -> None:
    binary = debian_tool("prometheus", "prometheus")
    keys = SpiderKeys.build("forum", prefix=prefix)
    stats = {"item_scraped_count": 7, "downloader/response_status_count/200": 9}
    client.hset(keys.stats, mapping=stats)
    client.hset(keys.site("forum.example"), mapping={"leased": 40, "backoffs": 1})
    client.sadd(keys.site_known, "forum.example")  # the dashboard's site panels get data
    exporter_port, port = free_port(), free_port()
    server, _ = serve(
        client, [keys], exporter_port, "127.0.0.1", Registry(workers_key(prefix), 5.0)
    )
    rules = (ROOT / "monitoring/prometheus/rules.yml").resolve()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {
                        "job_name": "celery_crawl",
                        "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
                    }
                ],
            }
        )
    )
    command = [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}"]
    command.append(f"--web.listen-address=127.0.0.1:{port}")
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        groups = wait_for_evaluated_rules(port, deadline=time.monotonic() + 60)
        rules_seen = [rule for group in groups for rule in group["rules"]]
        in_file = yaml.safe_load(rules.read_text())["groups"]
        assert len(rules_seen) == sum(len(group["rules"]) for group in in_file) == 12
        assert all(rule["health"] == "ok" for rule in rules_seen), rules_seen
        at = last_scrape(port)  # every query at one scrape's time: no later scrape's gap
        items = prometheus_api(port, "query", query="celery_crawl_items_total", time=at)["result"]
        assert [(r["metric"]["spider"], r["value"][1]) for r in items] == [("forum", "7")]
        for expr in dashboard_exprs():  # each panel's query is valid PromQL with data
            assert prometheus_api(port, "query", query=expr, time=at)["result"], expr
    finally:
        process.terminate()
        process.wait(timeout=30)
        server.shutdown()


def wait_for_evaluated_rules(port: int, deadline: float) -> list[dict[str, Any]]:
    """The rule groups once every rule was evaluated at least once after a scrape."""
    while time.monotonic() < deadline:
        try:
            groups = prometheus_api(port, "rules")["groups"]
            up = prometheus_api(port, "query", query="up")["result"]
        except OSError:  # not listening yet
            groups, up = [], []
        rules = [rule for group in groups for rule in group["rules"]]
        scraped = any(r["value"][1] == "1" for r in up)
        if scraped and rules and all(not r["lastEvaluation"].startswith("0001") for r in rules):
            time.sleep(2)  # one more evaluation with the scraped series present
            return prometheus_api(port, "rules")["groups"]  # type: ignore[no-any-return]
        time.sleep(0.5)
    raise AssertionError("Prometheus did not scrape and evaluate the rules within 60 s")


def last_scrape(port: int) -> str:
    """When the last scrape that succeeded was taken: each sample it wrote has that time.

    The scrape timeout is the 1 s interval, and a scrape that fails marks the exporter's
    series stale: an instant query at the next moment finds none of them, until a scrape
    succeeds again. At a successful scrape's time, a series missing is one the exporter
    left out.
    """
    series = prometheus_api(port, "query", query="up[1m]")["result"]
    times = [at for one in series for at, value in one["values"] if value == "1"]
    assert times, series
    return str(max(times))


def dashboard() -> dict[str, Any]:
    return json.loads((ROOT / "monitoring/grafana/dashboards/celery_crawl.json").read_text())  # type: ignore[no-any-return]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for panel in dashboard()["panels"] for t in panel["targets"]]


def test_the_dashboard_names_only_exported_metrics(client: redis.Redis, prefix: str) -> None:
    names = exporter_names(client, prefix)
    exprs = dashboard_exprs()
    used = {name for expr in exprs for name in re.findall(r"celery_crawl_[a-z_]+", expr)}
    assert used and used <= names
    titles = {panel["title"] for panel in dashboard()["panels"]}
    assert {"Queue length", "Pages/s", "Items/s", "Responses by status"} <= titles
    assert {"Requests/s per site", "Sites: in flight and back-offs"} <= titles


def test_status_json_shows_spiders_jobs_and_workers(
    app: Celery, start_worker: Callable[..., Worker], env: dict[str, str]
) -> None:
    worker = start_worker(name="watched", pool="solo")
    job = crawl("forum", forum_seeds(), app=app)
    job.wait(timeout=120)
    waiting = crawl("forum", [{"forum_id": "00001"}], app=app)
    waiting.cancel()  # finished, so it must not be listed as running
    schedule = project_of(app).schedule("forum")
    schedule.put(Source("late", seeds=["00001"], interval=60))  # no beat: it stays due
    schedule.client.zadd(schedule.keys.schedule_due, {"late": int(time.time() * 1000) - 120_000})
    args = ["status", "--json", "-A", WORKER_APP]
    out = run_module("celery_crawl.tools.cli", args, env, timeout=60, check=True)
    data = json.loads(out.stdout)
    spiders = {s["spider"]: s for s in data["spiders"]}
    assert set(spiders) >= set(SPIDERS)
    for entry in spiders.values():
        assert set(entry) == {
            "spider",
            "queue",
            "in_flight",
            "dedup",
            "dropped",
            "pages_per_s",
            "items_per_s",
            "jobs",
            "sources",
        }
        assert entry["dropped"] == 0
    assert spiders["forum_detail"]["pages_per_s"] > 0  # pages of the last minute
    assert spiders["forum_detail"]["items_per_s"] > 0
    assert spiders["forum"]["jobs"] == []  # both jobs finished
    late = spiders["forum"]["sources"]
    assert (late["sources"], late["overdue"]) == (1, 1) and 120 <= late["oldest_overdue"] < 180
    assert spiders["forum_detail"]["sources"] == {"sources": 0, "overdue": 0, "oldest_overdue": 0}
    assert any(name.startswith("watched@") for name in data["workers"])
    assert worker.output().count("hosting crawlers") == 1


def test_status_lists_each_running_job_once_with_its_progress(app: Celery) -> None:
    """No worker: the jobs wait in their queues, running. A group's jobs show under the group."""
    from celery_crawl.tools.cli import spider_keys
    from celery_crawl.tools.status import snapshot

    seeds = forum_seeds()
    forum = crawl("forum", seeds, app=app)
    paths = crawl("paths", [{"path": "ok"}, {"path": "slow"}], app=app)
    client, spiders = spider_keys(app)
    data = snapshot(client, spiders, app)
    by_spider = {s["spider"]: s for s in data["spiders"]}
    waiting = {"state": "running", "in_flight": 0, "done": 0, "pages": 0, "items": 0, "dropped": 0}
    no_worker = "waiting: no live worker hosts"  # this test starts none
    assert by_spider["forum"]["jobs"] == [
        {"job_id": forum.id, "spider": "forum", "queued": len(seeds), **waiting}
        | {"waiting": f"{no_worker} forum"}
    ]
    assert by_spider["paths"]["jobs"] == [
        {"job_id": paths.id, "spider": "paths", "queued": 2, **waiting}
        | {"waiting": f"{no_worker} paths"}
    ]
    assert by_spider["forum_detail"]["jobs"] == []  # the forum group's job, listed once
    assert (by_spider["forum"]["queue"], by_spider["paths"]["queue"]) == (len(seeds), 2)
    assert data["workers"] == []


def test_a_job_that_fetches_no_page_fails(
    app: Celery, start_worker: Callable[..., Worker], db_url: str
) -> None:
    """Failed: every download refused, no page. Celery records FAILURE; the exporter counts it."""
    start_worker(pool="solo")
    job = crawl("paths", [{"path": "refused"}], app=app)
    result = job.wait(timeout=120)
    assert result["state"] == "failed"
    assert result["pages"] == 0
    assert result["errors"] == {"DownloadConnectionRefusedError": 3}  # a try and 2 retries
    job.result.get(timeout=30, propagate=False)
    assert job.result.state == "FAILURE"
    assert "fetched no page" in str(job.result.result)
    ok = crawl("paths", [{"path": "missing"}], app=app).wait(timeout=120)
    assert ok["state"] == "done"  # a 404 is a page: the job did not fail

    metrics = scrape(redis.Redis.from_url(db_url), [project_of(app).keys("paths")])
    assert total(metrics, "celery_crawl_jobs_finished_total", state="failed") == 1
    assert total(metrics, "celery_crawl_jobs_finished_total", state="done") == 1


def damage_job_states(client: redis.Redis, keys: SpiderKeys) -> str:
    client.hset(keys.job_states, "done", "abc")
    return keys.job_states


def damage_stats_field(client: redis.Redis, keys: SpiderKeys) -> str:
    client.hset(keys.stats, b"downloader/response_status_count/\xff\xfe", "3")
    return keys.stats


def damage_dedup_count(client: redis.Redis, keys: SpiderKeys) -> str:
    client.set(keys.dupefilter_count, "abc")
    return keys.dupefilter_count


def damage_site_name(client: redis.Redis, keys: SpiderKeys) -> str:
    client.sadd(keys.site_known, b"\xffbad.example")
    return keys.site_known


def damage_last_response(client: redis.Redis, keys: SpiderKeys) -> str:
    client.hset(keys.stats, "celery_crawl/last_response_time", "yesterday")
    return keys.stats


def damage_inflight_type(client: redis.Redis, keys: SpiderKeys) -> str:
    client.set(keys.inflight, "not a sorted set")
    return keys.inflight


def damage_job_hash(client: redis.Redis, keys: SpiderKeys) -> str:
    job = client.smembers(keys.active_jobs).pop().decode()
    client.hset(keys.job(job), "created_at", "\xff")
    return keys.job(job)


def damage_rate(client: redis.Redis, keys: SpiderKeys) -> str:
    minute = int(time.time() // 60)
    client.hset(keys.stats_rate(minute), "item_scraped_count", "many")
    return keys.stats_rate(minute)


DAMAGE = {
    "job-state index": damage_job_states,
    "stats field": damage_stats_field,
    "dedup count": damage_dedup_count,
    "site name": damage_site_name,
    "last response": damage_last_response,
    "in-flight type": damage_inflight_type,
    "job hash": damage_job_hash,  # status only: the exporter reads no job hash
    "rate hash": damage_rate,  # status only
}


def healthy_crawl_state(app: Celery, client: redis.Redis) -> tuple[SpiderKeys, list[SpiderKeys]]:
    """A running job (no worker), stats, a site: series for every spider to serve."""
    from celery_crawl.tools.cli import spider_keys

    crawl("forum", [{"forum_id": "00001"}], app=app)
    _, spiders = spider_keys(app)
    forum = next(keys for keys in spiders if keys.spider == "forum")
    client.hset(forum.stats, mapping={"item_scraped_count": 5, "downloader/request_count": 9})
    client.sadd(forum.site_known, "forum.example")
    client.hset(forum.site("forum.example"), mapping={"leased": 4})
    return forum, spiders


def run_status(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    wide = {**env, "COLUMNS": "400"}  # rich wraps no key in a table cell
    return run_module("celery_crawl.tools.cli", ["status", *args, "-A", WORKER_APP], wide, 60)


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_bad_value_is_named_and_skipped_and_the_rest_is_served(
    app: Celery, env: dict[str, str], state_client: redis.Redis, kind: str
) -> None:
    forum, spiders = healthy_crawl_state(app, state_client)
    bad_key = DAMAGE[kind](state_client, forum)
    metrics = scrape(state_client, spiders)  # a 500 would raise here
    for spider in ("forum", "forum_detail", "paths"):
        assert ("celery_crawl_requests_total", (("spider", spider),)) in metrics
    assert total(metrics, "celery_crawl_items_total", spider="forum") == 5
    assert total(metrics, "celery_crawl_site_leased_total", site="forum.example") == 4
    exporter_reads = kind not in ("job hash", "rate hash")
    bad_count = total(metrics, "celery_crawl_exporter_bad_values_total", key=bad_key)
    assert bad_count == (1 if exporter_reads else 0), sorted(k for k in metrics if "bad" in k[0])
    if kind != "job-state index":
        assert total(metrics, "celery_crawl_jobs", spider="forum") == 1  # queued or running
    done = run_status(env, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    status_reads = kind != "last response"  # status shows no time of last response
    assert [row["key"] for row in data["bad_values"]] == ([bad_key] if status_reads else [])
    by_spider = {s["spider"]: s for s in data["spiders"]}
    assert set(by_spider) >= {"forum", "forum_detail", "paths"}
    assert len(by_spider["forum"]["jobs"]) == (0 if kind == "job hash" else 1)


def test_status_names_every_bad_key_on_screen(
    app: Celery, env: dict[str, str], state_client: redis.Redis
) -> None:
    forum, _ = healthy_crawl_state(app, state_client)
    bad_keys = {damage(state_client, forum) for damage in DAMAGE.values()}
    done = run_status(env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"bad values skipped: {len(bad_keys)} keys" in done.stdout  # stats: two damages
    for key in bad_keys:
        assert key in done.stdout
