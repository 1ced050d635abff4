"""Redis Sentinel: URLs, acks that wait for a replica, and a real failover mid-crawl."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.sentinel import MasterNotFoundError

from celery_crawl import crawl
from celery_crawl.app.factory import transport_conf
from celery_crawl.core import connection, scripts
from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.jobs.handle import Job
from celery_crawl.queue.queues import PriorityQueue
from tests.support.failover import assert_nothing_lost, ha_app
from tests.support.forum import FORUM
from tests.support.ha_servers import SentinelSet, wait_for
from tests.support.workers import Worker


def test_sentinel_urls_and_the_explicit_broker_they_need(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "redis+sentinel://:pw@10.0.0.1:26380,10.0.0.2/crawl/2"
    parsed = connection.MultiHostUrl.parse(url, 26379)
    assert parsed.hosts == [("10.0.0.1", 26380), ("10.0.0.2", 26379)]
    assert (parsed.password, connection.sentinel_service(parsed)) == ("pw", ("crawl", 2))
    assert connection.redact(url) == "redis+sentinel://:***@10.0.0.1:26380,10.0.0.2/crawl/2"
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    with pytest.raises(ConfigError, match="broker_url"):
        transport_conf(url, {})
    conf = transport_conf(url, {"broker_url": "redis://b:1/0"})
    assert conf == {"broker_url": "redis://b:1/0", "result_backend": "redis://b:1/0"}
    plain = transport_conf("redis://h:1/0", {})
    assert plain == {"broker_url": "redis://h:1/0", "result_backend": "redis://h:1/0"}
    for bad in ("redis+sentinel://h:1", "redis+sentinel://h:1/crawl/x", "redis+sentinel:///s"):
        with pytest.raises(ConfigError):
            connection.get_redis(bad)


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "tls"])
def test_a_client_follows_a_failover(request: pytest.FixtureRequest, secure: bool) -> None:
    """With ``rediss+sentinel://``, TLS to the sentinels and to each master in turn."""
    sentinel_set: SentinelSet = request.getfixturevalue(
        "tls_sentinel_set" if secure else "sentinel_set"
    )
    params = sentinel_set.tls.client_params() if sentinel_set.tls else {}
    client = connection.get_redis(sentinel_set.url, params)
    client.set("before", 1)
    assert client.wait(1, 5000) == 1  # on the replica too
    assert connection.describe(client) == "sentinel service 'crawlmaster'"
    blocked: list[Any] = []
    waiter = threading.Thread(target=lambda: blocked.append(blpop_or_error(client)))
    waiter.start()  # a blocked pop, as the schedulers' wake-up waits are
    time.sleep(0.3)
    sentinel_set.master.kill()
    started = time.monotonic()
    assert client.get("before") == b"1"  # retried until the sentinels named the replica
    assert time.monotonic() - started < 30
    assert sentinel_set.master_port() == sentinel_set.replica.port
    assert client.set("after", 2) and sentinel_set.replica.client.get("after") == b"2"
    waiter.join(30)
    assert blocked == [None]  # its retry reconnected to the new master, where it timed out


def test_a_master_gone_past_the_failover_retries_costs_each_call_one_try(
    sentinel_set: SentinelSet,
) -> None:
    """Master and replica both dead, and the first sentinel the client asks: the first call
    spends the retries that ride out a failover, then each call tries once (the sentinels
    asked, the dead one refusing at once), until the master is back and a command goes
    through."""
    client = connection.get_redis(sentinel_set.url, {})
    client.set("before", 1)
    assert client.wait(1, 5000) == 1
    master = sentinel_set.master
    sentinel_set.sentinels[0].kill()  # the first in the URL: asked first on every try
    sentinel_set.replica.kill()
    master.kill()
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.get("before")
    spent = time.monotonic() - started
    retry = client.get_retry()
    assert isinstance(retry, connection.OutageRetry) and retry.away
    assert spent > 10  # its retries spent: about 20 s of back-off, a failover's time
    tries = []
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(MasterNotFoundError):  # the live sentinels: the master is down
            client.get("before")
        tries.append(time.monotonic() - started)
    assert max(tries) < 2, tries
    sentinel_set.start_again(master)
    wait_for(lambda: bool(client.ping()), 30, "the master answers the client again")
    assert client.get("before") == b"1" and not retry.away


def blpop_or_error(client: redis.Redis) -> Any:
    try:
        return client.blpop(["nothing"], timeout=3)
    except redis.RedisError as exc:
        return exc


@pytest.mark.alone  # a wait timed within bounds
def test_acks_wait_for_a_replica_in_the_same_round_trip(
    replicated: SentinelSet, caplog: pytest.LogCaptureFixture
) -> None:
    master, replica = replicated.master.client, replicated.replica.client
    keys = SpiderKeys.build("forum", prefix="acks")
    queue = PriorityQueue(master, keys, ack_replicas=1, ack_timeout=0.5)
    queue.start_job("j", [Entry(f"r{i}".encode(), job="j") for i in range(3)], {})
    first, second, third = queue.lease(3)
    for name, includes in (("enqueue", {"dupefilter": "dedup_exact"}), ("ack", {})):
        master.script_load(scripts.source(name, **includes))  # else NOSCRIPT: load, run again
    waits = wait_calls(master)
    assert queue.push_many([Entry(b"child", job="j")], acks=[first.member]) == [True]
    assert queue.ack([second.member]) == 1
    assert wait_calls(master) == waits + 2  # one WAIT per acking script, nothing else
    assert replica.zcard(keys.inflight) == 1  # both acks were on the replica on return
    master.script_flush()  # a master that lost its scripts (restarted, promoted) loads them
    replicated.replica.pause()
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="celery_crawl.queue.queues"):
            assert queue.ack([third.member]) == 1
        assert 0.4 < time.monotonic() - started < 5
        assert "reached 0 of 1 replicas" in caplog.text
    finally:
        replicated.replica.pause(False)
    assert Job("j", "forum", master, keys).status().done == 3


def wait_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_wait", {})
    return int(stats.get("calls", 0))


def test_the_crawl_survives_a_master_failover(
    sentinel_set: SentinelSet,
    db_url: str,
    sites: dict[str, str],
    forum_site: Any,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, env = ha_app(sentinel_set.url, db_url, sites, prefix, tmp_path, monkeypatch)
    worker = Worker("failover", env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        job = crawl("forum", [{"forum_id": f} for f in FORUM.forum_ids()], app=app)
        wait_for(lambda: job.status().pages >= 40, 60, "the crawl is under way", step=0.02)
        sentinel_set.master.kill()
        fetched_before = set(forum_site.site.requests_by_path)
        result = job.wait(timeout=240)
        assert sentinel_set.master_port() == sentinel_set.replica.port
        after = crawl("paths", [{"chain": "r", "length": 3}], app=app)
        assert after.result.get(timeout=120)["pages"] == 3  # job tasks read the new master
    finally:
        assert worker.stop() == 0, worker.output()[-3000:]
    assert_nothing_lost(result, forum_site.site.requests_by_path, fetched_before, tmp_path)


def test_the_scheduler_takes_the_ack_replica_settings(make_crawler: Any) -> None:
    from celery_crawl.scheduler.scheduler import Scheduler

    crawler = make_crawler(CELERY_CRAWL_ACK_REPLICAS=1, CELERY_CRAWL_ACK_TIMEOUT=0.25)
    queue = Scheduler.from_crawler(crawler).queue
    assert (queue.ack_replicas, queue.ack_timeout) == (1, 0.25)
