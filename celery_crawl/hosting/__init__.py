"""Layer 2: the Scrapy project seen from Celery, the long-lived crawlers each worker
process hosts, the worker registry, and the Scrapy components that carry jobs through a
crawl (middlewares, feeds, the scrapy-redis spiders and pipeline)."""

from celery_crawl.core.exports import lazy

# what the old module ``celery_crawl.hosting`` held, from where it lives now
__getattr__ = lazy(__name__, {}, fallbacks=["celery_crawl.hosting.host"])
