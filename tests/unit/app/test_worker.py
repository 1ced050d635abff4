"""Which errors a worker's crawlers wait out as they open (celery_crawl.app.worker.redis_outage)."""

from __future__ import annotations

import redis
from twisted.internet.defer import FirstError
from twisted.python.failure import Failure

from celery_crawl.app.worker import redis_outage
from celery_crawl.core.errors import ConfigError, RedisUnavailable


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
