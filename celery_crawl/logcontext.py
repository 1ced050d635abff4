"""Settings path ``celery_crawl.logcontext.*``, the log context components.

The code lives in :mod:`celery_crawl.hosting.logcontext`.
"""

from celery_crawl.hosting.logcontext import (
    CrawlFormatter,
    LogContextDownloaderMiddleware,
    LogContextExtension,
    LogContextSpiderMiddleware,
)

__all__ = [
    "CrawlFormatter",
    "LogContextDownloaderMiddleware",
    "LogContextExtension",
    "LogContextSpiderMiddleware",
]
