"""Settings path ``celery_crawl.pipelines.*``, the scrapy-redis item pipeline.

The code lives in :mod:`celery_crawl.hosting.pipelines`.
"""

from celery_crawl.hosting.pipelines import RedisPipeline

__all__ = ["RedisPipeline"]
