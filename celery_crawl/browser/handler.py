"""scrapy-playwright's download handler, with every render bounded and every failure retried.

Set it where scrapy-playwright's own handler would go::

    DOWNLOAD_HANDLERS = {
        "http": "celery_crawl.browser.handler.BrowserDownloadHandler",
        "https": "celery_crawl.browser.handler.BrowserDownloadHandler",
    }

It is scrapy-playwright's ``ScrapyPlaywrightDownloadHandler``, changed in two ways
that hosted crawlers need, because their process outlives any one render:

- **A render has a deadline** (``BROWSER_RENDER_TIMEOUT``). A browser killed mid-render
  (out of memory, a crash) is started again by scrapy-playwright, but the pages it was
  rendering could wait forever: in a hosted worker, whose leases are renewed while it
  lives, that request was never finished, and its job never ended. Past the deadline the
  render fails with Scrapy's ``DownloadTimeoutError``.
- **A failed render is a failed download.** Playwright's errors (a browser that closed,
  a navigation that failed or timed out) become Scrapy's ``DownloadFailedError``, which
  the retry middleware retries (``RETRY_TIMES``), as it does a connection lost by plain
  HTTP: the page goes back to the queue, and is not counted as done unrendered.

Requests without ``meta={"playwright": True}`` are plain HTTP, as with scrapy-playwright.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from playwright.async_api import Error as PlaywrightError
from scrapy.exceptions import DownloadFailedError, DownloadTimeoutError
from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler

from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)


class BrowserDownloadHandler(ScrapyPlaywrightDownloadHandler):  # type: ignore[misc]
    """scrapy-playwright's handler; a render is bounded in time, and retried when it fails."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self.render_timeout = float(setting(crawler.settings, "BROWSER_RENDER_TIMEOUT"))
        if not self.render_timeout > 0:
            raise ConfigError(
                f"BROWSER_RENDER_TIMEOUT is {self.render_timeout}: it must be above 0"
            )

    async def _download_request(self, request: Request, spider: Spider | None = None) -> Response:
        render = super()._download_request(request, spider)
        try:
            response: Response = await asyncio.wait_for(render, timeout=self.render_timeout)
        except TimeoutError:
            self.stats.inc_value("browser/render_timeout")
            raise DownloadTimeoutError(
                f"rendering {request.url} took more than {self.render_timeout:g} s"
                " (BROWSER_RENDER_TIMEOUT)"
            ) from None
        except PlaywrightError as exc:
            self.stats.inc_value("browser/render_failed")
            raise DownloadFailedError(f"rendering {request.url} failed: {exc}") from exc
        return response

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        return cls(crawler)
