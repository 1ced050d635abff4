"""Layer 1: what a site is, its shared limits, pause and back-off (``politeness/lua``), and
the downloader middleware that applies them (``celery_crawl.politeness.SiteLimitsMiddleware``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_crawl.core.exports import lazy

if TYPE_CHECKING:
    from celery_crawl.politeness.middleware import SiteLimitsMiddleware
    from celery_crawl.politeness.robots import SharedRobotsTxtMiddleware

__all__ = ["SharedRobotsTxtMiddleware", "SiteLimitsMiddleware"]
__getattr__ = lazy(
    __name__,
    {
        **dict.fromkeys(("SiteLimitsMiddleware",), "celery_crawl.politeness.middleware"),
        "SharedRobotsTxtMiddleware": "celery_crawl.politeness.robots",
    },
    fallbacks=["celery_crawl.politeness.middleware"],
)
