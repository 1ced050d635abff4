"""Layer 1: the shared request queue: priority levels, leases, acks and dead letters,
in Redis (``queue/lua``). ``celery_crawl.queue.PriorityQueue`` and its siblings are the
``SCHEDULER_QUEUE_CLASS`` paths."""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_crawl.core.exports import lazy

if TYPE_CHECKING:
    from celery_crawl.core.entries import Entry
    from celery_crawl.queue.queues import (
        Base,
        FifoQueue,
        LifoPriorityQueue,
        LifoQueue,
        PriorityQueue,
    )

__all__ = ["Base", "Entry", "FifoQueue", "LifoPriorityQueue", "LifoQueue", "PriorityQueue"]
__getattr__ = lazy(
    __name__,
    {
        "Entry": "celery_crawl.core.entries",
        **dict.fromkeys(
            ("Base", "FifoQueue", "LifoPriorityQueue", "LifoQueue", "PriorityQueue"),
            "celery_crawl.queue.queues",
        ),
    },
    fallbacks=["celery_crawl.queue.queues", "celery_crawl.core.entries"],
)
