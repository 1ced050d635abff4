"""Dedup uses Scrapy's fingerprints, stores binary digests, and counts exactly."""

from __future__ import annotations

from typing import Any

import redis
from scrapy import Request

from celery_crawl.dupefilter import RFPDupeFilter


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
