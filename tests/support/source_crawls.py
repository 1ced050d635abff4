"""A crawl of a source on a real queue, without Scrapy: a job whose seed links children."""

from __future__ import annotations

from celery_crawl.core.entries import Entry
from celery_crawl.queue.queues import Base


def crawl_source(queue: Base, job: str, source: str, children: list[bytes]) -> list[bool]:
    """Job ``job`` of ``source``: its seed, then ``children`` (fingerprints) pushed as if
    the seed's page linked them; every request leased and acked, so the job ends. Which
    children were new (queued)."""
    fields = {"spider": queue.keys.spider, "source": source}
    created, _ = queue.start_job(job, [Entry(b"seed", 0, None, job)], fields)
    assert created
    flags = queue.push_many([Entry(b"child", 0, fp, job) for fp in children])
    for _ in range(len(children) + 1):  # bounded: the seed and each child, once
        leases = queue.lease(100)
        if not leases:
            break
        queue.ack([lease.member for lease in leases])
    assert len(queue) == queue.in_flight() == 0
    return flags
