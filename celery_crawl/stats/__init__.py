"""Layer 1: the crawl-wide stats hash, shared by every process of a spider
(``STATS_CLASS = "celery_crawl.stats.RedisStatsCollector"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_crawl.core.exports import lazy

if TYPE_CHECKING:
    from celery_crawl.stats.collector import RedisStatsCollector

__all__ = ["RedisStatsCollector"]
__getattr__ = lazy(
    __name__,
    {
        **dict.fromkeys(("RedisStatsCollector",), "celery_crawl.stats.collector"),
    },
    fallbacks=["celery_crawl.stats.collector"],
)
