"""Settings path ``celery_crawl.middleware.*``, the job middlewares.

The code lives in :mod:`celery_crawl.hosting.middleware`.
"""

from celery_crawl.hosting.middleware import (
    HostedStartMiddleware,
    JobDepthMiddleware,
    JobDownloaderMiddleware,
    JobSpiderMiddleware,
)

__all__ = [
    "HostedStartMiddleware",
    "JobDepthMiddleware",
    "JobDownloaderMiddleware",
    "JobSpiderMiddleware",
]
