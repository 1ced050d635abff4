"""Layer 3, the Celery side: the app factory, the job and producer tasks, the worker
bootsteps (crawler hosting, job trackers), the broker transport, and :func:`crawl`, the
entry point of application code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_crawl.core.exports import lazy

if TYPE_CHECKING:
    from celery_crawl.app.factory import create_app

__all__ = ["create_app"]
__getattr__ = lazy(
    __name__,
    {
        **dict.fromkeys(("create_app",), "celery_crawl.app.factory"),
    },
    fallbacks=["celery_crawl.app.factory"],
)
