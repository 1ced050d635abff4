"""Settings path ``celery_crawl.connection.*``, the Redis client factories.

The code lives in :mod:`celery_crawl.core.connection`.
"""

from celery_crawl.core.connection import from_settings, get_redis

__all__ = ["from_settings", "get_redis"]
