"""celery_crawl: Scrapy crawls hosted by Celery workers, sharing one Redis queue.

``from celery_crawl import crawl`` starts a job from application code.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["crawl", "create_app"]


def __getattr__(name: str) -> Any:
    # Celery and Scrapy load only when asked for, not on `import celery_crawl`
    if name in __all__:
        from celery_crawl import celery_app

        return getattr(celery_app, name)
    raise AttributeError(f"module 'celery_crawl' has no attribute {name!r}")
