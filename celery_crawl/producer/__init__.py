"""Layer 1: beat-driven job production, capped by the work already waiting in Redis."""

from celery_crawl.core.exports import lazy

# what the old module ``celery_crawl.producer`` held, from where it lives now
__getattr__ = lazy(__name__, {}, fallbacks=["celery_crawl.producer.producer"])
