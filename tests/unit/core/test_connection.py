"""Connection settings, one pool per process, retries, and key templates."""

from __future__ import annotations

import pytest
import redis
from scrapy.settings import Settings

from celery_crawl.core import connection
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys


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
