"""Scraping a real exporter's /metrics, and summing its samples."""

from __future__ import annotations

import urllib.request
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from celery_crawl.core.keys import SpiderKeys
from celery_crawl.tools.exporter import serve
from tests.support.ports import free_port


def scrape(client: redis.Redis, keys: list[SpiderKeys]) -> dict[tuple[str, tuple[Any, ...]], float]:
    """GET /metrics from a real exporter; {(sample name, sorted labels): value}."""
    port = free_port()
    server, _ = serve(client, keys, port, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    finally:
        server.shutdown()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(metrics: dict[tuple[str, tuple[Any, ...]], float], name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, pairs), value in metrics.items()
        if sample == name and labels.items() <= dict(pairs).items()
    )
