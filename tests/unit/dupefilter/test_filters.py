"""Dedup: the contract every filter class keeps, then exact, bloom and expiring on their own."""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Any

import pytest
import redis
from scrapy import Request

from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.dupefilter.filters import (
    KINDS,
    BloomDupeFilter,
    BloomParams,
    ExpiringDupeFilter,
    ExpiringParams,
    RFPDupeFilter,
)
from celery_crawl.hosting.project import Project, load_settings
from celery_crawl.scheduler.scheduler import Scheduler
from celery_crawl.tools import exporter
from tests.support.round_trips import RoundTrips
from tests.support.stub_spider import ForumSpider


def test_uses_the_crawlers_fingerprinter(make_crawler: Any) -> None:
    class UrlOnly:
        def fingerprint(self, request: Request) -> bytes:
            return request.url.encode().ljust(20, b"\0")[:20]

    crawler = make_crawler(REQUEST_FINGERPRINTER_CLASS=UrlOnly)
    df = RFPDupeFilter.from_crawler(crawler)
    assert df.fingerprint(Request("http://a/x")) == b"http://a/x".ljust(20, b"\0")
    default = RFPDupeFilter.from_crawler(make_crawler())
    assert default.fingerprint(
        Request("http://a/x")
    ) == make_crawler().request_fingerprinter.fingerprint(Request("http://a/x"))


def test_request_seen_and_exact_count(make_crawler: Any) -> None:
    df = RFPDupeFilter.from_crawler(make_crawler())
    assert df.request_seen(Request("http://a/1")) is False
    assert df.request_seen(Request("http://a/1")) is True
    assert df.request_seen(Request("http://a/2")) is False
    assert len(df) == 2


def test_fingerprints_are_stored_as_binary_digests(make_crawler: Any, client: redis.Redis) -> None:
    df = RFPDupeFilter.from_crawler(make_crawler())
    df.request_seen(Request("http://a/1"))
    members = [
        m
        for key in client.scan_iter(match=df.keys.dupefilter + ":0:*")
        for m in client.smembers(key)
    ]
    assert members == [df.fingerprint(Request("http://a/1"))]
    assert len(members[0]) == 20


def test_many_fingerprints_across_generations(make_crawler: Any) -> None:
    df = RFPDupeFilter.from_crawler(make_crawler())
    first = [f"http://a/{i}" for i in range(20_000)]  # past generation 0 (8,192)
    fps = [df.fingerprint(Request(url)) for url in first]
    assert all(df.add_fingerprints(fps))
    assert not any(df.add_fingerprints(fps))
    assert len(df) == 20_000
    assert df.memory_usage() / 20_000 < 40
    df.clear()
    assert len(df) == 0
    assert all(df.add_fingerprints(fps[:10]))


# -- every dedup class: the same contract --------------------------------------

FILTER_CLASSES = [kind.filter for kind in KINDS.values()]  # every registered kind


def digests(count: int, seed: int) -> list[bytes]:
    """Distinct 20-byte digests, like Scrapy's SHA-1 fingerprints (seeded: reproducible)."""
    rng = random.Random(seed)
    return list({rng.randbytes(20) for _ in range(count)})


def add_all(df: RFPDupeFilter, fingerprints: list[bytes], batch: int = 10_000) -> list[bool]:
    flags: list[bool] = []
    for start in range(0, len(fingerprints), batch):
        flags += df.add_fingerprints(fingerprints[start : start + batch])
    return flags


def seen_all(df: RFPDupeFilter, fingerprints: list[bytes], batch: int = 10_000) -> list[bool]:
    flags: list[bool] = []
    for start in range(0, len(fingerprints), batch):
        flags += df.seen_fingerprints(fingerprints[start : start + batch])
    return flags


@pytest.fixture(params=FILTER_CLASSES, ids=lambda cls: cls.__name__)
def any_filter(request: pytest.FixtureRequest, make_crawler: Any) -> RFPDupeFilter:
    cls: type[RFPDupeFilter] = request.param
    return cls.from_crawler(make_crawler(DUPEFILTER_EXPIRE_SECONDS=600))


def test_contract_add_seen_count_clear(any_filter: RFPDupeFilter) -> None:
    fps = digests(500, seed=1)
    assert any_filter.seen_fingerprints(fps[:3]) == [False] * 3  # seen records nothing
    assert all(any_filter.add_fingerprints(fps))
    assert not any(any_filter.add_fingerprints(fps))
    assert all(any_filter.seen_fingerprints(fps))
    assert len(any_filter) == 500
    assert any_filter.memory_usage() > 0
    any_filter.clear()
    assert len(any_filter) == 0
    assert any_filter.memory_usage() == 0
    assert not any(any_filter.seen_fingerprints(fps))


def test_contract_keys_share_the_spiders_hash_tag(
    any_filter: RFPDupeFilter, client: redis.Redis
) -> None:
    any_filter.add_fingerprints(digests(100, seed=2))
    keys = list(client.scan_iter(match=any_filter.keys.dupefilter + "*"))
    assert keys
    assert all(key.startswith(f"{any_filter.keys.dupefilter}:".encode()) for key in keys)
    assert all(b"{forum}" in key for key in keys)


def test_contract_the_exporter_reports_the_filters_size(
    any_filter: RFPDupeFilter, client: redis.Redis
) -> None:
    assert exporter.read(client, [any_filter.keys])[0].fingerprints == 0
    add_all(any_filter, digests(300, seed=21))
    [reading] = exporter.read(client, [any_filter.keys])
    assert reading.fingerprints == len(any_filter) == 300


@pytest.mark.parametrize("cls", FILTER_CLASSES, ids=lambda cls: cls.__name__)
def test_scheduler_dedup_and_enqueue_in_one_round_trip(
    make_crawler: Any, cls: type[RFPDupeFilter]
) -> None:
    path = f"celery_crawl.dupefilter.filters.{cls.__name__}"
    crawler = make_crawler(DUPEFILTER_CLASS=path, DUPEFILTER_BLOOM_CAPACITY=1000)
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(ForumSpider.from_crawler(crawler))
    assert type(scheduler.df) is cls
    scheduler.enqueue_request(Request("http://127.0.0.1/warm-up"))
    scheduler.flush()  # the server caches the script (a first call also loads it)
    urls = ["http://127.0.0.1/a", "http://127.0.0.1/b", "http://127.0.0.1/a"]
    with RoundTrips(scheduler.queue.client) as trips:
        for url in urls:
            scheduler.enqueue_request(Request(url))
        scheduler.flush()
    assert trips.commands == ["EVALSHA"]
    assert len(scheduler.queue) == 3
    assert crawler.stats.get_value("dupefilter/filtered") == 1
    fps = [scheduler.df.fingerprint(Request(url)) for url in urls[:2]]
    assert scheduler.df.seen_fingerprints(fps) == [True, True]  # in this class's own layout
    scheduler.close("finished")


@pytest.mark.parametrize("cls", [BloomDupeFilter, ExpiringDupeFilter], ids=lambda c: c.__name__)
def test_jobs_started_outside_a_crawl_use_the_configured_filter(
    settings: dict[str, Any], client: redis.Redis, cls: type[RFPDupeFilter]
) -> None:
    path = f"celery_crawl.dupefilter.filters.{cls.__name__}"
    project = Project(load_settings("tasks.settings", {**settings, "DUPEFILTER_CLASS": path}))
    queue = project.queue("forum")
    assert queue.dedup == cls.script_from_settings(project.settings)
    seeds = [Entry(b"s", fingerprint=fp, job="j1") for fp in [b"x" * 20, b"y" * 20, b"x" * 20]]
    assert queue.start_job("j1", seeds, {"spider": "forum"}) == (True, 2)
    df = cls(client, queue.keys, None, params=cls.params_class.from_settings(project.settings))
    assert df.seen_fingerprints([b"x" * 20, b"y" * 20, b"z" * 20]) == [True, True, False]


# -- bloom filter ---------------------------------------------------------------


def bloom(client: redis.Redis, prefix: str, **params: Any) -> BloomDupeFilter:
    keys = SpiderKeys.build("forum", prefix=prefix)
    return BloomDupeFilter(client, keys, None, params=BloomParams(**params))


def five_sigma_bound(probes: int, rate: float) -> float:
    """False positives that ``probes`` fresh fingerprints stay under, for a rate of ``rate``.

    Each probe is a false positive independently with probability at most
    ``rate``, so their number is binomial: mean n*p, deviation sqrt(n*p*(1-p)).
    Five deviations above the mean is exceeded with probability about 1e-6 (the
    Poisson tail at these sizes), so a pass is no luck, and a bad filter
    (rates of several times p) fails by far.
    """
    mean = probes * rate
    return mean + 5 * math.sqrt(mean * (1 - rate))


def test_bloom_false_positive_rate_is_within_bound(client: redis.Redis, prefix: str) -> None:
    df = bloom(client, prefix, capacity=100_000, error_rate=0.001)
    inserted, fresh = digests(100_000, seed=3), digests(100_000, seed=4)
    add_all(df, inserted)
    assert all(seen_all(df, inserted))  # no false negatives
    false_positives = sum(seen_all(df, fresh))
    assert false_positives <= five_sigma_bound(len(fresh), 0.001)  # 0.1% + tolerance: 150
    assert len(df) >= 100_000 - five_sigma_bound(100_000, 0.001)  # FPs while adding
    stored = df.stored_params()
    assert stored["filters"] == "1"  # at capacity, not past it
    assert df.memory_usage() < 2 * 100_000  # under 2 bytes a fingerprint


def test_bloom_grows_past_capacity_and_keeps_the_rate(client: redis.Redis, prefix: str) -> None:
    df = bloom(client, prefix, capacity=10_000, error_rate=0.001)
    inserted, fresh = digests(50_000, seed=5), digests(50_000, seed=6)
    add_all(df, inserted, batch=1000)
    stored = df.stored_params()
    assert stored["filters"] == "3"  # 10k + 20k, then a third of 40k
    capacities = [int(stored[f"capacity:{i}"]) for i in range(3)]
    assert capacities == [10_000, 20_000, 40_000]
    bits_per_fp = [int(stored[f"bits:{i}"]) / capacities[i] for i in range(3)]
    assert bits_per_fp[0] < bits_per_fp[1] < bits_per_fp[2]  # each rate tighter
    assert all(seen_all(df, inserted))
    assert sum(seen_all(df, fresh)) <= five_sigma_bound(len(fresh), 0.001)


def test_bloom_bit_positions_spread(client: redis.Redis, prefix: str) -> None:
    """2e5 fingerprints set about m(1 - e^(-kn/m)) distinct bits, as k independent hashes would."""
    df = bloom(client, prefix, capacity=200_000)
    add_all(df, digests(200_000, seed=7))
    stored = df.stored_params()
    m, k, n = int(stored["bits:0"]), int(stored["k:0"]), len(df)
    expected = m * (1 - math.exp(-k * n / m))
    assert abs(client.bitcount(df.keys.dupefilter + ":bloom:0") - expected) < 0.01 * expected


def test_bloom_bitmap_is_allocated_whole(client: redis.Redis, prefix: str) -> None:
    df = bloom(client, prefix, capacity=100_000)
    df.open()  # creates the first sub-filter
    key = df.keys.dupefilter + ":bloom:0"
    size = int(df.stored_params()["bits:0"]) // 8
    assert client.strlen(key) == size
    before = client.memory_usage(key, samples=0)
    assert before is not None and size <= before < size + 1024
    add_all(df, digests(50_000, seed=8))
    assert client.memory_usage(key, samples=0) == before


def test_bloom_sub_filters_stay_below_max_bits(client: redis.Redis, prefix: str) -> None:
    df = bloom(client, prefix, capacity=10_000, max_bits=8192)
    fps = digests(3000, seed=9)
    add_all(df, fps, batch=500)
    stored = df.stored_params()
    filters = int(stored["filters"])
    assert filters > 1
    for i in range(filters):
        assert int(stored[f"bits:{i}"]) <= 8192
        assert client.strlen(f"{df.keys.dupefilter}:bloom:{i}") <= 1024
    assert all(seen_all(df, fps))


def test_bloom_mismatched_settings_keep_the_stored_filter_and_warn(
    client: redis.Redis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = bloom(client, prefix, capacity=1000, error_rate=0.01)
    first_fps = digests(800, seed=10)
    add_all(first, first_fps)
    second = bloom(client, prefix, capacity=5000, error_rate=0.001)
    with caplog.at_level(logging.WARNING, logger="celery_crawl.dupefilter.filters"):
        second.open()
    assert "capacity=1000 (settings: 5000)" in caplog.text
    assert "error_rate=0.01 (settings: 0.001)" in caplog.text
    second_fps = digests(2000, seed=11)
    add_all(second, second_fps)  # past the stored capacity: grows by the stored parameters
    stored = second.stored_params()
    assert stored["capacity:0"] == "1000" and stored["capacity:1"] == "2000"
    assert all(seen_all(first, first_fps + second_fps))
    assert all(seen_all(second, first_fps + second_fps))


def test_a_filter_of_another_kind_refuses_the_spiders_keys(
    client: redis.Redis, prefix: str
) -> None:
    """Switching DUPEFILTER_CLASS must not silently start an empty filter beside the old one."""
    keys = SpiderKeys.build("forum", prefix=prefix)
    exact = RFPDupeFilter(client, keys, None)
    exact.open()
    exact.add_fingerprints(digests(10, seed=20))
    exact.open()  # the same kind opens again
    for other in (
        BloomDupeFilter(client, keys, None),
        ExpiringDupeFilter(client, keys, None, params=ExpiringParams(window_ms=60_000)),
    ):
        with pytest.raises(ConfigError, match=rf"of kind 'exact'.*{type(other).__name__}"):
            other.open()
    exact.clear()  # the kind goes with the filter
    bloom_filter = BloomDupeFilter(client, keys, None)
    bloom_filter.open()
    with pytest.raises(ConfigError, match="of kind 'bloom'"):
        exact.open()
    bloom_filter.clear()


def test_bloom_parameters_are_checked() -> None:
    with pytest.raises(ConfigError):
        BloomParams(error_rate=1.5)
    with pytest.raises(ConfigError):
        BloomParams(max_bits=2**33)
    with pytest.raises(ConfigError):
        ExpiringParams(window_ms=0)
    with pytest.raises(ConfigError, match="ExpiringParams"):
        ExpiringDupeFilter(redis.Redis(), SpiderKeys.build("s"), None, params=BloomParams())


# -- expiring filter ------------------------------------------------------------


def redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def expiring(client: redis.Redis, prefix: str, window_ms: int, buckets: int) -> ExpiringDupeFilter:
    keys = SpiderKeys.build("forum", prefix=prefix)
    return ExpiringDupeFilter(client, keys, None, params=ExpiringParams(window_ms, buckets))


def test_expiring_remembers_for_the_window_then_forgets(client: redis.Redis, prefix: str) -> None:
    window, buckets = 1500, 3
    width = window // buckets
    df = expiring(client, prefix, window, buckets)
    fp = b"f" * 20
    added_after = redis_ms(client)
    assert df.add_fingerprints([fp]) == [True]
    added_before = redis_ms(client)
    time.sleep(width * 1.2 / 1000)  # into a later time bucket, well within the window
    assert df.add_fingerprints([fp]) == [False]
    for _ in range(500):  # bounded: about 2 s of polling
        asked = redis_ms(client)
        seen = df.seen_fingerprints([fp])[0]
        answered = redis_ms(client)
        if not seen:
            assert answered >= added_after + window  # never forgotten within the window
        if asked >= added_before + window + width:
            assert not seen  # forgotten by window + one bucket
            break
        time.sleep(0.01)
    else:
        pytest.fail("the fingerprint outlived window + one bucket")
    assert df.add_fingerprints([fp]) == [True]  # accepted again


def test_expiring_keys_expire_whole_without_a_clear(client: redis.Redis, prefix: str) -> None:
    # A window of seconds, not one: on a loaded machine the add and the scan once took
    # longer than a 1 s window and its last bucket, and every key was gone before it was seen.
    window, buckets = 4000, 4
    width = window // buckets
    df = expiring(client, prefix, window, buckets)
    added_after = redis_ms(client)
    add_all(df, digests(5000, seed=12))
    added_before = redis_ms(client)
    pattern = df.keys.dupefilter + ":t:*"
    keys = list(client.scan_iter(match=pattern, count=1000))
    assert len(keys) > 10 and len(df) == 5000
    ttls = [client.pttl(key) for key in keys]
    assert all(0 < ttl <= window + width for ttl in ttls)  # each key expires on its own
    full = df.memory_usage()
    for _ in range(800):  # bounded: about 8 s
        if redis_ms(client) >= added_before + window + width:
            break
        time.sleep(0.01)
    assert redis_ms(client) - added_after >= window
    assert client.exists(*keys) == 0
    assert list(client.scan_iter(match=pattern, count=1000)) == []
    assert len(df) == 0
    assert df.memory_usage() < full / 100  # only the small parameter hash is left
