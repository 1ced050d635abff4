"""scrapy-playwright's download handler, with every render bounded and every failure retried.

Set it where scrapy-playwright's own handler would go::

    DOWNLOAD_HANDLERS = {
        "http": "celery_crawl.browser.handler.BrowserDownloadHandler",
        "https": "celery_crawl.browser.handler.BrowserDownloadHandler",
    }

It is scrapy-playwright's ``ScrapyPlaywrightDownloadHandler``, changed in the ways
that hosted crawlers need, because their process outlives any one render and hosts
several spiders:

- **One browser per process** (:mod:`celery_crawl.browser.shared`): every handler of
  the process with the same launch settings renders in the same Playwright driver and
  browser, each in contexts of its own. At most ``BROWSER_MAX_PAGES`` renders are under
  way in it at once, for all of them together; the others wait their turn.
- **A render has a deadline** (``BROWSER_RENDER_TIMEOUT``). A browser killed mid-render
  (out of memory, a crash) is started again by scrapy-playwright, but the pages it was
  rendering could wait forever: in a hosted worker, whose leases are renewed while it
  lives, that request was never finished, and its job never ended. Past the deadline the
  render fails with Scrapy's ``DownloadTimeoutError``, and its page is closed, which
  gives its place among ``PLAYWRIGHT_MAX_PAGES_PER_CONTEXT`` back. A render still
  waiting for a place stops waiting; a page still being made is made, then closed
  (:mod:`celery_crawl.browser.places`).
- **A failed render is a failed download.** Playwright's errors (a browser that closed,
  a navigation that failed or timed out) become Scrapy's ``DownloadFailedError``, which
  the retry middleware retries (``RETRY_TIMES``), as it does a connection lost by plain
  HTTP: the page goes back to the queue, and is not counted as done unrendered.
- **The browser is recycled** after ``BROWSER_RECYCLE_PAGES`` renders (by every handler
  that shares it), or once the process's browser (its Playwright driver and Chromium
  processes) holds more than ``BROWSER_RECYCLE_MEMORY_MB`` (read every
  :data:`MEMORY_CHECK_EVERY` renders): new renders wait, the ones under way finish,
  every handler's contexts and the browser are closed, and the next render starts a new
  one. Pages a callback kept open (``playwright_include_page``) close with it. Counted
  as ``browser/recycled/pages`` and ``browser/recycled/memory``.

Requests without ``meta={"playwright": True}`` are plain HTTP, as with scrapy-playwright.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from playwright.async_api import Error as PlaywrightError
from scrapy.exceptions import DownloadFailedError, DownloadTimeoutError
from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler

from celery_crawl.browser.places import PageMakings, closed, within
from celery_crawl.browser.shared import SharedProvider, closed_in_time, shared_browser
from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

logger = logging.getLogger(__name__)
MEMORY_CHECK_EVERY = 20  # renders between two reads of the browser's memory
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def descendants_rss_mb(root: int) -> float:
    """MiB resident in the processes descended from ``root`` (``root`` itself left out)."""
    parents: dict[int, int] = {}
    pages: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            pages[int(entry.name)] = int((entry / "statm").read_text().split()[1])
            parents[int(entry.name)] = int(stat[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return sum(pages.get(pid, 0) for pid in found) * PAGE_SIZE / 2**20


class BrowserDownloadHandler(ScrapyPlaywrightDownloadHandler):  # type: ignore[misc]
    """scrapy-playwright's handler, on its process's shared browser: a render is bounded in
    time and retried when it fails, renders are capped per process, and the browser is
    recycled by renders or by memory."""

    browser_provider_cls: Any  # scrapy-playwright's, set by its __init__; then ours

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        self.render_timeout = float(setting(settings, "BROWSER_RENDER_TIMEOUT"))
        self.recycle_pages = int(setting(settings, "BROWSER_RECYCLE_PAGES"))
        self.recycle_mb = float(setting(settings, "BROWSER_RECYCLE_MEMORY_MB"))
        self.max_pages = int(setting(settings, "BROWSER_MAX_PAGES"))
        if not self.render_timeout > 0:  # checked before a browser is prepared
            raise ConfigError(f"BROWSER_RENDER_TIMEOUT is {self.render_timeout}: must be above 0")
        if self.recycle_pages < 0 or not self.recycle_mb >= 0:
            raise ConfigError("BROWSER_RECYCLE_PAGES, BROWSER_RECYCLE_MEMORY_MB: 0 (off) or more")
        if self.max_pages < 1:
            raise ConfigError(f"BROWSER_MAX_PAGES is {self.max_pages}: must be 1 or more")
        super().__init__(crawler)
        limits = {  # a spider with other bounds gets a browser of its own
            "BROWSER_MAX_PAGES": self.max_pages,
            "BROWSER_RECYCLE_PAGES": self.recycle_pages,
            "BROWSER_RECYCLE_MEMORY_MB": self.recycle_mb,
        }
        self.shared = shared_browser(self.config, self.browser_provider_cls, limits)
        self.shared.forget[id(self)] = self._forget_browser
        # scrapy-playwright makes its provider from this at engine start: the shared one
        self.browser_provider_cls = lambda _config: SharedProvider(self.shared)
        self._pages: dict[int, Any] = {}  # id of a request being rendered -> its page
        self._makings = PageMakings()  # pages being made, for renders a deadline may cancel

    async def _download_request(self, request: Request, spider: Spider | None = None) -> Response:
        await self._admit()
        try:
            return await self._render(request, spider)
        finally:
            self.shared.rendering -= 1  # at once: a cancel while waiting cannot lose it
            await asyncio.shield(self._notify())

    async def _notify(self) -> None:
        async with self.shared.gate:
            self.shared.gate.notify_all()

    async def _admit(self) -> None:
        """Wait for a place among BROWSER_MAX_PAGES and while the browser is recycled;
        recycle it first when it is due."""
        shared = self.shared
        async with shared.gate:
            await shared.gate.wait_for(
                lambda: not shared.draining and shared.rendering < self.max_pages
            )
            reason = self._recycle_reason()
            if reason:
                shared.draining = True
                try:
                    await shared.gate.wait_for(lambda: shared.rendering == 0)
                    logger.info("browser: recycled after %d renders (%s)", shared.rendered, reason)
                    self.stats.inc_value(f"browser/recycled/{reason}")
                    await shared.recycle()  # a browser that fails to close is logged
                finally:
                    shared.draining = False
                    shared.gate.notify_all()
            shared.rendering += 1
            shared.rendered += 1

    def _recycle_reason(self) -> str:
        """``pages`` or ``memory`` when the browser is due for recycling, else ``""``."""
        shared = self.shared
        if shared.browser is None or not shared.rendered:
            return ""
        if self.recycle_pages and shared.rendered >= self.recycle_pages:
            return "pages"
        checked = self.recycle_mb and shared.rendered % MEMORY_CHECK_EVERY == 0
        if checked and descendants_rss_mb(os.getpid()) > self.recycle_mb:
            return "memory"
        return ""

    def _forget_browser(self, browser: Any) -> list[Awaitable[Any]]:
        """Drop ``browser`` (closed on purpose, by a recycle or the last handler's close) and
        this handler's contexts; the closes of its contexts, to await."""
        if browser is not None and getattr(self, "browser", None) is browser:
            # scrapy-playwright's disconnect handler, which would run later and could drop
            # the next browser, is not called for this one
            self.browser.remove_listener("disconnected", self._browser_disconnected_callback)
            del self.browser  # the next render asks the shared browser again
        closing = [wrapper.context.close() for wrapper in self.context_wrappers.values()]
        self.context_wrappers.clear()
        return closing

    async def _close(self) -> None:
        """As the crawler closes: this handler's contexts; the process's browser and
        driver close with the last handler that uses them."""
        self.shared.forget.pop(id(self), None)
        await closed_in_time(self._forget_browser(getattr(self, "browser", None)))
        if getattr(self, "browser_provider", None):
            await self.browser_provider.close()

    async def _create_browser_context(self, *args: Any, **kwargs: Any) -> Any:
        """scrapy-playwright's new context, whose places among
        ``PLAYWRIGHT_MAX_PAGES_PER_CONTEXT`` a render cancelled at its deadline does not
        wait for (:class:`~celery_crawl.browser.places.PagePlaces`). It relies on
        scrapy-playwright's private ``_create_page`` taking a place by awaiting
        ``wrapper.semaphore.acquire()``, in the task that ``PageMakings.made`` runs it
        in (the version is pinned for this, pyproject.toml)."""
        wrapper = await super()._create_browser_context(*args, **kwargs)
        wrapper.semaphore = self._makings.places(self.config.max_pages_per_context)
        return wrapper

    async def _create_page(self, request: Request, spider: Spider) -> Any:
        """scrapy-playwright's new page for ``request``, remembered for its deadline; if
        the deadline passes meanwhile, the page is made and closed, or not made at all
        (:class:`~celery_crawl.browser.places.PageMakings`)."""
        creating = super()._create_page(request=request, spider=spider)
        page = await self._makings.made(creating)
        self._pages[id(request)] = page
        return page

    async def _render(self, request: Request, spider: Spider | None) -> Response:
        render = super()._download_request(request, spider)
        try:
            response: Response = await within(
                render, self.render_timeout, f"the render of {request.url}"
            )
        except TimeoutError:
            self.stats.inc_value("browser/render_timeout")
            await self._close_page(request)  # a cancelled render leaves its page, and its slot
            raise DownloadTimeoutError(
                f"rendering {request.url} took more than {self.render_timeout:g} s"
                " (BROWSER_RENDER_TIMEOUT)"
            ) from None
        except PlaywrightError as exc:
            self.stats.inc_value("browser/render_failed")
            # scrapy-playwright leaves it open for a callback (playwright_include_page),
            # but the render is retried, in a page of its own
            await self._close_page(request)
            raise DownloadFailedError(f"rendering {request.url} failed: {exc}") from exc
        finally:
            self._pages.pop(id(request), None)
        return response

    async def _close_page(self, request: Request) -> None:
        """Close the page of a render that was cancelled or failed: scrapy-playwright
        closes a page, which frees its place among ``PLAYWRIGHT_MAX_PAGES_PER_CONTEXT``,
        only when the render ends or fails without ``playwright_include_page``, never
        when it is cancelled."""
        page = self._pages.get(id(request))
        if page is None or page.is_closed():
            return
        if await closed(page, f"the page of {request.url}"):
            self.stats.inc_value("playwright/page_count/closed")

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        return cls(crawler)
