"""Settings path ``celery_crawl.feeds.*``, the per-job feed exporter.

The code lives in :mod:`celery_crawl.hosting.feeds`.
"""

from celery_crawl.hosting.feeds import JobFeedExporter

__all__ = ["JobFeedExporter"]
