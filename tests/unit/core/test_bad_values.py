"""Bad values met by the exporter: each key logged once, counted at every scrape, never fatal."""

from __future__ import annotations

import logging

import redis

from celery_crawl.core.bad_values import MAX_KEYS, OTHER_KEYS, BadValues
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.tools.exporter import CrawlCollector


def samples(collector: CrawlCollector) -> dict[tuple[str, ...], float]:
    """(sample name, its key or spider label, its state label) -> value."""
    found = {}
    for family in collector.collect():
        for s in family.samples:
            subject = s.labels.get("key") or s.labels.get("spider", "")
            found[(s.name, subject, s.labels.get("state", ""))] = s.value
    return found


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_bad_key_is_logged_once_and_counted_at_each_scrape(
    client: redis.Redis, prefix: str
) -> None:
    keys = SpiderKeys.build("forum", prefix=prefix)
    client.hset(keys.job_states, mapping={"running": "x", "done": 2})
    client.set(keys.dupefilter_count, "abc")
    collector = CrawlCollector(client, [keys])
    logger, lines = logging.getLogger("celery_crawl.core.bad_values"), Lines()
    logger.addHandler(lines)
    try:
        samples(collector)
        found = samples(collector)
    finally:
        logger.removeHandler(lines)
    bad = "celery_crawl_exporter_bad_values_total"
    assert found[(bad, keys.job_states, "")] == found[(bad, keys.dupefilter_count, "")] == 2
    assert found[("celery_crawl_jobs_finished_total", "forum", "done")] == 2  # served
    assert ("celery_crawl_jobs", "forum", "running") not in found  # skipped, not 0
    assert ("celery_crawl_dedup_fingerprints", "forum", "") not in found
    assert ("celery_crawl_queue_length", "forum", "") in found
    named = lines.lines
    assert len(named) == 2
    assert any("~states: field 'running': 'x' is not a whole number" in line for line in named)


def test_the_keys_named_are_bounded() -> None:
    bad = BadValues()
    for i in range(MAX_KEYS + 50):
        bad.note(f"key{i}", "x" * 10_000)
    assert len(bad.counts) == MAX_KEYS + 1 and bad.counts[OTHER_KEYS] == 50
    assert all(len(reason) < 300 for reason in bad.reasons.values())
