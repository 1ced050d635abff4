"""Feeds per job: the part that needs no worker (the rest: tests/integration/test_job_end.py)."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy.extensions.feedexport import FeedExporter

from celery_crawl.errors import ConfigError
from celery_crawl.feeds import JobFeedExporter


def test_job_feeds_are_told_apart_from_the_spiders(make_crawler: Any, tmp_path: Any) -> None:
    feeds = {
        str(tmp_path / "%(job)s-%(worker)s.jsonl"): {"format": "jsonlines"},
        str(tmp_path / "all.jsonl"): {"format": "jsonlines"},
    }
    exporter = JobFeedExporter(make_crawler(FEEDS=feeds))
    assert exporter.job_feeds == [str(tmp_path / "%(job)s-%(worker)s.jsonl")]


def test_a_scrapy_without_the_methods_it_builds_on_is_refused_at_start(
    make_crawler: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(FeedExporter, "_close_slot")
    feeds = {str(tmp_path / "%(job)s.jsonl"): {"format": "jsonlines"}}
    with pytest.raises(ConfigError, match=r"FeedExporter has no _close_slot.*Scrapy 2\.19"):
        JobFeedExporter(make_crawler(FEEDS=feeds))
