"""Layer 1: cookie jars per job, in the process or shared through Redis
(``celery_crawl.cookies.SharedCookiesMiddleware``), and the shared jars' store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_crawl.core.exports import lazy

if TYPE_CHECKING:
    from celery_crawl.cookies.middleware import SharedCookiesMiddleware

__all__ = ["SharedCookiesMiddleware"]
__getattr__ = lazy(
    __name__,
    {
        **dict.fromkeys(("SharedCookiesMiddleware",), "celery_crawl.cookies.middleware"),
    },
    fallbacks=["celery_crawl.cookies.middleware"],
)
