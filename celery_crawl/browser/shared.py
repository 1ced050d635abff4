"""One browser per worker process, shared by every hosted spider that renders.

scrapy-playwright starts a Playwright driver and a browser per download handler, and
a handler is per crawler: a worker process hosting three spiders that render would
run three browsers. :class:`SharedBrowser` is the process's one driver and browser
for every :class:`~celery_crawl.browser.handler.BrowserDownloadHandler` with the same
launch settings (browser type, launch options, remote endpoint, provider) and the
same bounds (``BROWSER_MAX_PAGES``, ``BROWSER_RECYCLE_PAGES``,
``BROWSER_RECYCLE_MEMORY_MB``); each handler keeps its own contexts, which are cheap.
It also holds what must be counted for the whole browser, not per spider: the
renders under way (``BROWSER_MAX_PAGES``), those since it started
(``BROWSER_RECYCLE_PAGES``), and the gate that makes new renders wait while it is
recycled.

It starts with the first handler's crawler and closes with the last one's: the
browser itself only once a first page is rendered. It is scrapy-playwright's
browser provider (``PLAYWRIGHT_BROWSER_PROVIDER``, its default when unset) that
launches it, so a project's own provider is shared the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import TYPE_CHECKING, Any

from playwright.async_api import Error as PlaywrightError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping

    from playwright.async_api import Browser, BrowserContext
    from scrapy_playwright.handler import Config

logger = logging.getLogger(__name__)
CLOSE_TIMEOUT = 30.0  # seconds a browser may take to close


class SharedBrowser:
    """The process's Playwright driver and browser for one set of launch settings and bounds."""

    def __init__(self, key: str, provider: Any) -> None:
        self.key = key
        self.provider = provider  # scrapy-playwright's BrowserProvider, for this key
        self.browser: Browser | None = None
        self.users = 0  # handlers whose crawler has started it, and not closed
        self.lock = asyncio.Lock()  # starts, launches and closes, one at a time
        # renders: a handler admits one under ``gate`` (celery_crawl.browser.handler)
        self.gate = asyncio.Condition()
        self.rendering = 0  # under way, for every handler
        self.rendered = 0  # since the browser started
        self.draining = False  # being recycled: new renders wait
        self.forget: dict[int, Any] = {}  # id of a handler -> its callback that drops it

    async def start(self) -> None:
        """One more handler uses it: the first starts the driver (not yet the browser)."""
        async with self.lock:
            if not self.users:
                await self.provider.start()
            self.users += 1

    async def launch_browser(self) -> Browser:
        """The browser, launched now if there is none or it is gone (crashed, recycled)."""
        async with self.lock:
            if self.browser is None or not self.browser.is_connected():
                self.browser = await self.provider.launch_browser()
            return self.browser

    async def launch_persistent_context(self, context_kwargs: dict[str, Any]) -> BrowserContext:
        """A persistent context (``user_data_dir``) is a browser of its own, not shared."""
        context: BrowserContext = await self.provider.launch_persistent_context(context_kwargs)
        return context

    async def close(self) -> None:
        """One handler less: the last closes the browser and the driver."""
        async with self.lock:
            self.users -= 1
            if self.users > 0:
                return
            browser, self.browser = self.browser, None
            try:
                await _close_browser(browser)
            finally:
                await self.provider.close()

    async def recycle(self) -> None:
        """Close the browser, with no render under way: every handler forgets it and
        closes its contexts; the next render launches a new one."""
        async with self.lock:
            browser, self.browser = self.browser, None
            self.rendered = 0
            closing: list[Awaitable[Any]] = []
            for forget in list(self.forget.values()):
                closing += forget(browser)
            try:
                await closed_in_time(closing)
            finally:  # cancelled or not: the old browser does not stay behind
                await asyncio.shield(_close_browser(browser))


async def closed_in_time(closing: list[Awaitable[Any]]) -> None:
    """Await the closes of contexts, within :data:`CLOSE_TIMEOUT`: one that fails is let
    go (the browser's close follows), and if they do not all end in time, that is logged
    and they are left to the browser's close."""
    try:
        await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True), CLOSE_TIMEOUT)
    except TimeoutError:
        logger.warning("browser: its contexts did not close in %g s", CLOSE_TIMEOUT)


async def _close_browser(browser: Browser | None) -> None:
    """Close ``browser`` if it is still there, within :data:`CLOSE_TIMEOUT`; a browser
    that does not close in time, or fails to, is logged: its process dies with the
    driver's, or with the worker's."""
    if browser is None or not browser.is_connected():
        return
    try:
        await asyncio.wait_for(browser.close(), timeout=CLOSE_TIMEOUT)
    except (TimeoutError, PlaywrightError) as exc:
        logger.warning("browser: closing it failed: %s", str(exc) or type(exc).__name__)


# this process's shared browsers, by launch settings; a forked child starts afresh. An
# entry stays once its last handler closed: a handler made later starts it again
_processes: dict[str, SharedBrowser] = {}
os.register_at_fork(after_in_child=_processes.clear)


def launch_key(config: Config, provider_cls: type, limits: Mapping[str, Any]) -> str:
    """The settings that make two handlers' browsers the same one, with the process:
    how it is launched, and ``limits``, the BROWSER_* settings that bound it (a spider
    with other bounds gets a browser of its own, never a share of a tighter one)."""
    settings = {
        "pid": os.getpid(),
        "limits": dict(limits),
        "provider": f"{provider_cls.__module__}.{provider_cls.__qualname__}",
        "type": config.browser_type_name,
        "launch": config.launch_options,
        "cdp": [config.cdp_url, config.cdp_kwargs],
        "connect": [config.connect_url, config.connect_kwargs],
    }
    return json.dumps(settings, sort_keys=True, default=repr)


def shared_browser(
    config: Config, provider_cls: type, limits: Mapping[str, Any] | None = None
) -> SharedBrowser:
    """This process's shared browser for ``config``'s launch settings and ``limits``, made
    if it is new."""
    key = launch_key(config, provider_cls, limits or {})
    shared = _processes.get(key)
    if shared is None:
        shared = _processes[key] = SharedBrowser(key, provider_cls(config))
    return shared


class SharedProvider:
    """What a handler is given as its browser provider: its process's shared browser."""

    def __init__(self, shared: SharedBrowser) -> None:
        self.shared = shared
        self.started = False

    async def start(self) -> None:
        await self.shared.start()
        self.started = True

    async def launch_browser(self) -> Browser:
        return await self.shared.launch_browser()

    async def launch_persistent_context(self, context_kwargs: dict[str, Any]) -> BrowserContext:
        return await self.shared.launch_persistent_context(context_kwargs)

    async def close(self) -> None:
        if self.started:  # once per handler, and only if its crawler started it
            self.started = False
            await self.shared.close()
