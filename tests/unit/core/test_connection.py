"""Connection settings, one pool per process, retries, and key templates."""

from __future__ import annotations

import logging
import re
import uuid
from pathlib import Path

import pytest
import redis
from scrapy.settings import Settings

from celery_crawl.core import connection
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from tests.support.ports import persistent_valkey, start_again


def test_components_share_one_client(make_crawler: object) -> None:
    from celery_crawl.scheduler.scheduler import Scheduler

    crawler = make_crawler()  # type: ignore[operator]
    scheduler = Scheduler.from_crawler(crawler)
    assert scheduler.queue.client is scheduler.df.client is crawler.stats.client


def test_transient_disconnect_is_retried(redis_url: str) -> None:
    client = connection.get_redis(redis_url)
    client.set("retry-probe", 1)
    killer = redis.Redis.from_url(redis_url)
    killed = killer.client_kill_filter(_id=client.client_id())
    assert killed == 1
    assert client.get("retry-probe") == b"1"  # reconnected transparently
    client.delete("retry-probe")


def test_url_from_settings_and_bad_scheme() -> None:
    assert (
        connection.url_from_settings(Settings({"REDIS_URL": "rediss://h:1/2"})) == "rediss://h:1/2"
    )
    legacy = Settings({"REDIS_URL": None, "REDIS_HOST": "h", "REDIS_PORT": 7000})
    assert connection.url_from_settings(legacy) == "redis://h:7000/0"
    with pytest.raises(ConfigError, match="must start with"):
        connection.url_from_settings(Settings({"REDIS_URL": "http://h/"}))
    assert connection.redact("redis://u:secret@h:1/0") == "redis://u:***@h:1/0"


def test_key_templates_carry_the_spider_hash_tag() -> None:
    keys = SpiderKeys.build("forum", prefix="proj")
    for key in (keys.queue, keys.inflight, keys.dupefilter, keys.stats, keys.deadletter):
        assert key.startswith("proj:{forum}:")
    migrated = SpiderKeys.from_settings(
        "forum", Settings({"SCHEDULER_QUEUE_KEY": "%(spider)s:requests"})
    )
    assert migrated.queue == "{forum}:requests"
    with pytest.raises(ConfigError, match="hash tag"):
        SpiderKeys.build("forum", queue="requests")


def test_a_refused_config_get_warns_and_goes_on(
    client: redis.Redis, redis_url: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A managed Redis, or an ACL, may refuse CONFIG: the policy is not known, the crawl opens."""
    user = f"{prefix}-no-config"
    client.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"]
    )
    try:
        limited = redis.Redis.from_url(redis_url, username=user, password="pw")
        assert connection.check_eviction(client, allow=False) == "noeviction"
        with caplog.at_level("WARNING", logger="celery_crawl.core.connection"):
            assert connection.check_eviction(limited, allow=False) is None
        assert "maxmemory-policy not checked" in caplog.text
        assert connection.memory(limited) is not None  # INFO is still allowed
        client.acl_setuser(user, commands=["-info"])
        assert connection.memory(limited) is None  # not known: the tools show no memory line
    finally:
        client.acl_deluser(user)


class Attempts:
    """A call that fails with ``error`` ``failing`` times, then answers; its attempts counted."""

    def __init__(self, failing: int, error: Exception | None = None) -> None:
        self.failing = failing
        self.error = error or redis.ConnectionError("refused")
        self.made = 0

    def __call__(self) -> str:
        self.made += 1
        if self.made <= self.failing:
            raise self.error
        return "answer"


def fail_counted(error: Exception, count: int) -> None:
    """A command's failure handler (redis-py passes the failure count to it)."""


def no_backoff_retry() -> connection.OutageRetry:
    from redis.backoff import NoBackoff

    return connection.OutageRetry(NoBackoff(), retries=5)


def test_once_a_call_spent_its_retries_calls_try_once_until_one_goes_through() -> None:
    retry, failures = no_backoff_retry(), []
    down = Attempts(failing=100)
    with pytest.raises(redis.ConnectionError):
        retry.call_with_retry(down, failures.append)
    assert down.made == 6 and retry.away  # the first try and its 5 retries
    with pytest.raises(redis.ConnectionError):
        retry.call_with_retry(down, failures.append)
    assert down.made == 7 and retry.away  # one try: the server is known to be away
    assert len(failures) == 7  # each failure reached the connection's handler
    back = Attempts(failing=0)
    assert retry.call_with_retry(back, failures.append) == "answer" and retry.away  # a connect
    assert retry.call_with_retry(back, fail_counted, with_failure_count=True) == "answer"
    assert not retry.away  # a command went through
    again = Attempts(failing=100)
    with pytest.raises(redis.ConnectionError):
        retry.call_with_retry(again, failures.append)
    assert again.made == 6  # answered in between: a new outage spends its retries again


def test_a_reconnect_inside_a_failing_command_does_not_end_the_outage() -> None:
    """A server loading its data accepts connections and answers LOADING: the command's
    reconnect goes through, the command does not; the server is still away."""
    retry = no_backoff_retry()
    with pytest.raises(redis.ConnectionError):
        retry.call_with_retry(Attempts(failing=100), fail_counted, with_failure_count=True)
    assert retry.away

    def reconnect_then_loading() -> str:
        retry.call_with_retry(Attempts(failing=0), fail_counted, with_failure_count=True)
        raise redis.BusyLoadingError("LOADING Redis is loading the dataset in memory")

    with pytest.raises(redis.BusyLoadingError):
        retry.call_with_retry(reconnect_then_loading, fail_counted, with_failure_count=True)
    assert retry.away


def test_a_blip_within_the_retries_and_a_refusal_leave_the_server_counted_up() -> None:
    retry = no_backoff_retry()
    assert retry.call_with_retry(Attempts(failing=3), lambda error: None) == "answer"
    refused = Attempts(failing=1, error=redis.ResponseError("WRONGTYPE"))
    with pytest.raises(redis.ResponseError):
        retry.call_with_retry(refused, lambda error: None)
    assert refused.made == 1 and not retry.away  # an answer, not an outage


def test_every_connection_of_a_client_shares_its_outage(tmp_path: Path) -> None:
    """On a real server, stopped then started again: the client's connections are each
    given a copy of its retry, and all of them learn of the outage and of its end."""
    with persistent_valkey(tmp_path / "valkey", appendfsync="no") as server:
        client = connection.make_client(f"redis://127.0.0.1:{server.port}/0", {})
        assert client.ping()
        server.stop()
        with pytest.raises(redis.ConnectionError):
            client.ping()
        retries = [client.get_retry(), client.connection_pool.make_connection().retry]
        assert all(isinstance(r, connection.OutageRetry) and r.away for r in retries)
        with pytest.raises(redis.ConnectionError):  # away: one try, through the client's path
            client.set("k", "v")
        start_again(server)
        assert client.ping()
        assert not any(r.away for r in retries)


def test_a_repeated_away_warning_is_said_once_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = logging.getLogger("celery_crawl.test_away")
    message = f"Redis unreachable, nothing done {uuid.uuid4().hex}: %s"
    with caplog.at_level(logging.DEBUG, logger=log.name):
        for n in range(3):
            connection.warn_away(log, message, n)
        monkeypatch.setattr(connection, "AWAY_WARN_SECONDS", 0.0)
        connection.warn_away(log, message, 3)
        adapter = logging.LoggerAdapter(log, {})  # a spider's logger, say
        connection.warn_away(adapter, message, 4)
        connection.warn_away(adapter, message, 5)
    levels = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == log.name]
    # the last three after the interval was set to 0: each one said
    assert [level for level, _ in levels] == ["WARNING", "DEBUG", "DEBUG"] + ["WARNING"] * 3
    assert all(r.funcName.startswith("test_") for r in caplog.records if r.name == log.name)
    assert levels[0][1].endswith(": 0")
    assert re.search(r": 3 \(2 more like it since the last, \d+ s ago\)$", levels[3][1])
