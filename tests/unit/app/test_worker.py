"""Which errors a worker's crawlers wait out as they open (celery_crawl.app.worker.redis_outage),
and the write that checks Redis takes writes before they open (``check_room``)."""

from __future__ import annotations

import pytest
import redis
from twisted.internet.defer import FirstError
from twisted.python.failure import Failure

from celery_crawl.app.worker import check_room, redis_outage
from celery_crawl.core.errors import ConfigError, RedisUnavailable
from celery_crawl.core.keys import stopping_worker


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_redis_away_or_full_is_waited_out_through_twisted_and_causes() -> None:
    away = RedisUnavailable("cannot reach Redis")
    assert redis_outage(away)
    assert redis_outage(redis.exceptions.OutOfMemoryError("OOM"))
    assert redis_outage(FirstError(Failure(away), 0))  # one crawler of several failed
    try:
        try:
            raise redis.ConnectionError("refused")
        except redis.ConnectionError as exc:
            raise RuntimeError("opening failed") from exc
    except RuntimeError as chained:
        assert redis_outage(chained)


def test_a_configuration_error_is_not_waited_out_even_raised_while_redis_was_away() -> None:
    assert not redis_outage(ConfigError("SCHEDULER_QUEUE_CLASS: no such class"))
    assert not redis_outage(FirstError(Failure(raised(ConfigError("bad"))), 1))
    try:
        try:
            raise redis.ConnectionError("refused")
        except redis.ConnectionError:
            raise ConfigError("a dedup filter of another kind") from None
    except ConfigError as suppressed:
        assert not redis_outage(suppressed)


def test_a_shutdown_flag_of_another_type_is_deleted_and_never_stops_the_worker(
    client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    flag = stopping_worker(prefix, "w1@host")
    check_room(client, flag)  # changes nothing
    assert not client.exists(flag)
    client.rpush(flag, "garbage")
    check_room(client, flag)  # before, WRONGTYPE: the crawlers could not open, the worker stopped
    assert not client.exists(flag)
    assert f"key {flag} had the wrong type" in caplog.text
    client.set(flag, 1)  # a flag of its type is left as it is
    check_room(client, flag)
    assert client.get(flag) == b"1"
