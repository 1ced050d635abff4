"""RedisSpider's start key on a real server, its data contract, and the items pipeline's write."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import redis
from scrapy import Request
from scrapy.http import FormRequest
from scrapy.settings import Settings

from celery_crawl.core import connection
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import items_key, render_loose, start_urls_key
from celery_crawl.hosting.pipelines import RedisPipeline, Waiting, serializer_from_name
from celery_crawl.hosting.spiders import IdleClock, RedisCrawlSpider, RedisSpider, StartUrls


class PagesSpider(RedisSpider):
    name = "pages"


class CrawlPages(RedisCrawlSpider):
    name = "crawl_pages"


@pytest.fixture
def start(client: redis.Redis, prefix: str) -> StartUrls:
    return StartUrls(client, f"{prefix}:{{pages}}:start_urls")


def test_a_list_pops_in_order_a_batch_per_command(start: StartUrls, client: redis.Redis) -> None:
    client.rpush(start.key, *[f"u{n}" for n in range(5)])
    assert start.pop(3) == [b"u0", b"u1", b"u2"]
    assert len(start) == 2
    assert start.pop(3) == [b"u3", b"u4"]
    assert start.pop(3) == []


def test_a_set_and_a_sorted_set_pop_too(client: redis.Redis, prefix: str) -> None:
    as_set = StartUrls(client, f"{prefix}:set", "set")
    client.sadd(as_set.key, "a", "b", "c")
    assert sorted(as_set.pop(2) + as_set.pop(2)) == [b"a", b"b", b"c"]
    ranked = StartUrls(client, f"{prefix}:zset", "zset")
    client.zadd(ranked.key, {"low": 1, "high": 9, "mid": 5})
    assert ranked.pop(2) == [b"high", b"mid"]  # highest score first, as scrapy-redis reads it
    assert ranked.pop(2) == [b"low"]


def test_concurrent_pops_take_each_entry_once(start: StartUrls, client: redis.Redis) -> None:
    entries = [f"u{n}".encode() for n in range(2000)]
    client.rpush(start.key, *entries)
    taken: list[list[bytes]] = [[] for _ in range(4)]

    def drain(mine: list[bytes]) -> None:
        for _ in range(2000):  # bounded: at most one entry a pop
            batch = start.pop(7)
            if not batch:
                return
            mine += batch

    threads = [threading.Thread(target=drain, args=(mine,)) for mine in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    every = [entry for mine in taken for entry in mine]
    assert sorted(every) == sorted(entries)
    assert sum(bool(mine) for mine in taken) > 1


def test_start_keys_keep_the_hash_tag_or_stay_literal() -> None:
    settings = Settings({"CELERY_CRAWL_KEY_PREFIX": "p"})
    assert start_urls_key("pages", settings) == "p:{pages}:start_urls"
    assert start_urls_key("pages", settings, "%(name)s:start_urls") == "{pages}:start_urls"
    assert start_urls_key("pages", settings, "myspider:start_urls") == "myspider:start_urls"
    assert render_loose("%(prefix)s:fixed", "pages", "p") == "p:fixed"
    grouped = Settings({"CELERY_CRAWL_SPIDER_GROUPS": {"pages": "site"}})
    assert start_urls_key("pages", grouped, "%(name)s:urls") == "{site}/pages:urls"
    assert items_key("pages", Settings({"REDIS_ITEMS_KEY": "%(spider)s:items"})) == "{pages}:items"


def make_spider(make_crawler: Any, cls: type[RedisSpider] = PagesSpider, **settings: Any) -> Any:
    crawler = make_crawler(cls, **settings)
    crawler.spider = crawler.spidercls.from_crawler(crawler)
    return crawler.spider


def test_settings_shape_the_spider(make_crawler: Any, prefix: str) -> None:
    spider = make_spider(
        make_crawler,
        REDIS_START_URLS_AS_SET=True,
        REDIS_START_URLS_BATCH_SIZE=5,
        MAX_IDLE_TIME_BEFORE_CLOSE=7,
    )
    assert (spider.start_urls_source.key, spider.start_urls_source.kind) == (
        f"{prefix}:{{pages}}:start_urls",
        "set",
    )
    assert (spider.redis_batch_size, spider.max_idle_time) == (5, 7.0)
    default = make_spider(make_crawler, CrawlPages, CONCURRENT_REQUESTS=9)
    assert (default.redis_batch_size, default.max_idle_time) == (9, 0.0)  # as scrapy-redis


def test_start_data_becomes_requests_as_in_scrapy_redis(
    make_crawler: Any, client: redis.Redis
) -> None:
    spider = make_spider(make_crawler)
    data = [
        "http://127.0.0.1/page/1.html",
        json.dumps({"url": "http://127.0.0.1/page/2.html", "meta": {"n": 2}}),
        json.dumps({"url": "http://127.0.0.1/login", "method": "post", "user": "u"}),
    ]
    client.rpush(spider.start_urls_source.key, *data)
    first, second, third = spider.next_requests()
    assert (type(first), first.url, first.dont_filter) == (FormRequest, data[0], True)
    assert (second.url, second.meta["n"], second.method) == (
        "http://127.0.0.1/page/2.html",
        2,
        "GET",
    )
    assert (third.method, third.body) == ("POST", b"user=u")
    assert list(spider.next_requests()) == []


def test_bad_start_data_is_counted_not_raised(make_crawler: Any, client: redis.Redis) -> None:
    spider = make_spider(make_crawler)
    bad = [json.dumps({"no": "url"}), "{not json", json.dumps(["a", "list"]), b"\xff\xfe"]
    client.rpush(spider.start_urls_source.key, *bad, "http://127.0.0.1/ok")
    made = list(spider.next_requests())
    assert [r.url for r in made] == ["http://127.0.0.1/ok"]
    stats = spider.crawler.stats
    assert stats.get_value("celery_crawl/start_urls/no_url") == 1
    assert stats.get_value("celery_crawl/start_urls/invalid") == 3


def test_a_start_key_of_the_wrong_type_is_reported(make_crawler: Any, client: redis.Redis) -> None:
    spider = make_spider(make_crawler)  # reads a list
    client.sadd(spider.start_urls_source.key, "http://127.0.0.1/a")
    assert list(spider.next_requests()) == []
    assert spider.crawler.stats.get_value("celery_crawl/start_urls/errors") == 1


def test_a_custom_make_request_from_data_is_used(make_crawler: Any, client: redis.Redis) -> None:
    class Ids(PagesSpider):
        def make_request_from_data(self, data: bytes) -> Any:
            return [Request(f"http://127.0.0.1/page/{n}.html") for n in data.decode().split(",")]

    spider = make_spider(make_crawler, Ids)
    client.rpush(spider.start_urls_source.key, "1,2")
    assert [r.url for r in spider.next_requests()] == [
        "http://127.0.0.1/page/1.html",
        "http://127.0.0.1/page/2.html",
    ]


def test_the_idle_clock_runs_out_only_with_a_limit() -> None:
    now = [100.0]
    clock = IdleClock(5, clock=lambda: now[0])
    now[0] += 4.9
    assert not clock.expired()
    clock.reset()
    now[0] += 5
    assert clock.expired()
    assert not IdleClock(0, clock=lambda: now[0] + 1e9).expired()


def test_the_pipeline_writes_a_batch_in_one_round_trip(client: redis.Redis, prefix: str) -> None:
    pipeline = RedisPipeline(client)
    batch = [Waiting(f"{prefix}:{{a}}:items", json.dumps({"n": n}), {}, None) for n in range(3)]  # type: ignore[arg-type]
    batch.append(Waiting(f"{prefix}:{{b}}:items", "b", {}, None))  # type: ignore[arg-type]
    sent = []
    real = client.pipeline

    def pipeline_spy(*args: Any, **kwargs: Any) -> Any:
        pipe = real(*args, **kwargs)
        sent.append(pipe)
        return pipe

    client.pipeline = pipeline_spy  # type: ignore[method-assign]
    try:
        pipeline.write(batch)
    finally:
        del client.pipeline
    assert len(sent) == 1
    assert [json.loads(x)["n"] for x in client.lrange(f"{prefix}:{{a}}:items", 0, -1)] == [0, 1, 2]
    assert client.lrange(f"{prefix}:{{b}}:items", 0, -1) == [b"b"]


def test_item_serializers() -> None:
    assert serializer_from_name("json")({"a": 1}) == '{"a": 1}'
    assert serializer_from_name("json.dumps")([1]) == "[1]"
    with pytest.raises(ConfigError, match="REDIS_ITEMS_SERIALIZER"):
        serializer_from_name("no.such.function")


def test_redis_db_goes_with_redis_host_and_decoded_responses_are_refused(make_crawler: Any) -> None:
    settings = Settings({"REDIS_HOST": "h", "REDIS_PORT": 7000, "REDIS_DB": 3})
    assert connection.url_from_settings(settings) == "redis://h:7000/3"
    with pytest.raises(ConfigError, match="decode_responses"):
        make_spider(make_crawler, REDIS_PARAMS={"decode_responses": True})
