"""Layer 2: Scrapy's scheduler over the shared queue (``celery_crawl.scheduler.Scheduler``)
and its parts: the write-behind buffer, prefetched leases, the engine hooks, routing to
other spiders, a process's part in each job, crawl-wide limits and state, and the factory
of queues and dedup filters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_crawl.core.exports import lazy

if TYPE_CHECKING:
    from celery_crawl.scheduler.scheduler import Scheduler

__all__ = ["Scheduler"]
__getattr__ = lazy(
    __name__,
    {
        **dict.fromkeys(("Scheduler",), "celery_crawl.scheduler.scheduler"),
    },
    fallbacks=["celery_crawl.scheduler.scheduler"],
)
