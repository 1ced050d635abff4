"""Layer 1: the dedup filters (exact, bloom, expiring, hit-expiring), whose check-and-set
runs inside the queue's scripts (``dupefilter/lua``). Their classes are the
``DUPEFILTER_CLASS`` paths."""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_crawl.core.exports import lazy

if TYPE_CHECKING:
    from celery_crawl.dupefilter.filters import (
        BloomDupeFilter,
        ExpiringDupeFilter,
        HitExpiringDupeFilter,
        RFPDupeFilter,
    )

__all__ = ["BloomDupeFilter", "ExpiringDupeFilter", "HitExpiringDupeFilter", "RFPDupeFilter"]
__getattr__ = lazy(
    __name__,
    {
        **dict.fromkeys(
            ("BloomDupeFilter", "ExpiringDupeFilter", "HitExpiringDupeFilter", "RFPDupeFilter"),
            "celery_crawl.dupefilter.filters",
        ),
    },
    fallbacks=["celery_crawl.dupefilter.filters"],
)
