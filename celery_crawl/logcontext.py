"""Settings path ``celery_crawl.logcontext.*``, the log context components.

The code lives in :mod:`celery_crawl.jobs.logcontext`.
"""

from celery_crawl.jobs.logcontext import (
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
