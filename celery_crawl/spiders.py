"""Settings path ``celery_crawl.spiders.*``, the scrapy-redis spider base classes.

The code lives in :mod:`celery_crawl.hosting.spiders`.
"""

from celery_crawl.hosting.spiders import RedisCrawlSpider, RedisMixin, RedisSpider

__all__ = ["RedisCrawlSpider", "RedisMixin", "RedisSpider"]
