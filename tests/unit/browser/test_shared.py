"""The bookkeeping of a process's shared browser: started once, launched once, closed by
its last user, launched again once gone. Playwright itself is driven in
tests/integration/test_browser.py; here a recording provider stands in for it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from scrapy.settings import Settings
from scrapy_playwright.handler import Config

from celery_crawl.browser import shared as shared_module
from celery_crawl.browser.shared import SharedProvider, launch_key, shared_browser


class Browser:
    def __init__(self) -> None:
        self.connected = True

    def is_connected(self) -> bool:
        return self.connected

    async def close(self) -> None:
        self.connected = False


class RecordingProvider:
    """scrapy-playwright's provider protocol, recording its calls."""

    def __init__(self, config: Config) -> None:
        self.calls: list[str] = []
        self.browsers: list[Browser] = []

    async def start(self) -> None:
        self.calls.append("start")

    async def launch_browser(self) -> Browser:
        self.calls.append("launch")
        self.browsers.append(Browser())
        return self.browsers[-1]

    async def launch_persistent_context(self, context_kwargs: dict[str, Any]) -> str:
        self.calls.append(f"persistent {context_kwargs['user_data_dir']}")
        return "context"

    async def close(self) -> None:
        self.calls.append("close")


def config(**settings: Any) -> Config:
    return Config.from_settings(Settings({"PLAYWRIGHT_BROWSER_TYPE": "chromium", **settings}))


def test_handlers_with_the_same_launch_settings_share_one_driver_and_one_browser() -> None:
    async def scenario() -> None:
        same = config(PLAYWRIGHT_LAUNCH_OPTIONS={"headless": True, "args": ["--a"]})
        shared = shared_browser(same, RecordingProvider)
        again = config(PLAYWRIGHT_LAUNCH_OPTIONS={"args": ["--a"], "headless": True})
        assert shared_browser(again, RecordingProvider) is shared
        provider = shared.provider
        first, second = SharedProvider(shared), SharedProvider(shared)
        await first.start()
        await second.start()
        one = await first.launch_browser()
        assert await second.launch_browser() is one
        assert provider.calls == ["start", "launch"]
        await first.close()
        await first.close()  # a second close of the same handler changes nothing
        assert one.connected and provider.calls == ["start", "launch"]
        await second.close()  # the last user: the browser and the driver close
        assert not one.connected and provider.calls == ["start", "launch", "close"]
        third = SharedProvider(shared)  # a crawler started later starts it again
        await third.start()
        assert await third.launch_browser() is not one
        assert provider.calls[3:] == ["start", "launch"]
        await third.close()

    asyncio.run(scenario())


def test_a_browser_that_is_gone_or_recycled_is_launched_again_and_its_users_forget_it() -> None:
    async def scenario() -> None:
        shared = shared_browser(config(PLAYWRIGHT_LAUNCH_OPTIONS={"slow_mo": 1}), RecordingProvider)
        user = SharedProvider(shared)
        await user.start()
        crashed = await user.launch_browser()
        crashed.connected = False  # the browser died
        recycled = await user.launch_browser()
        assert recycled is not crashed
        forgotten: list[Any] = []

        def forget(browser: Any) -> list[Any]:
            forgotten.append(browser)
            return [asyncio.sleep(0)]  # a context's close, awaited by the recycle

        shared.forget[1] = forget
        shared.rendered = 7
        await shared.recycle()
        assert forgotten == [recycled] and not recycled.connected and shared.rendered == 0
        assert await user.launch_browser() not in (crashed, recycled)
        assert await user.launch_persistent_context({"user_data_dir": "/p"}) == "context"
        assert shared.provider.calls[-1] == "persistent /p"  # not the shared browser
        await user.close()

    asyncio.run(scenario())


def test_other_launch_settings_or_bounds_or_another_provider_get_a_browser_of_their_own() -> None:
    base = config(PLAYWRIGHT_LAUNCH_OPTIONS={"headless": True})
    bounds = {"BROWSER_MAX_PAGES": 16, "BROWSER_RECYCLE_PAGES": 1000}
    others = [
        (config(PLAYWRIGHT_LAUNCH_OPTIONS={"headless": False}), RecordingProvider, bounds),
        (
            config(PLAYWRIGHT_BROWSER_TYPE="firefox", PLAYWRIGHT_LAUNCH_OPTIONS={"headless": True}),
            RecordingProvider,
            bounds,
        ),
        (base, SharedProvider, bounds),
        (config(PLAYWRIGHT_CDP_URL="http://127.0.0.1:9222"), RecordingProvider, bounds),
        (base, RecordingProvider, {**bounds, "BROWSER_MAX_PAGES": 2}),
    ]
    same = launch_key(base, RecordingProvider, bounds)
    assert (
        launch_key(
            config(PLAYWRIGHT_LAUNCH_OPTIONS={"headless": True}), RecordingProvider, dict(bounds)
        )
        == same
    )
    keys = {launch_key(*other) for other in others}
    assert len(keys) == len(others) and same not in keys


def test_a_recycle_whose_contexts_do_not_close_still_closes_the_browser_in_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Renders wait while the browser is recycled: a context's close that never ends
    must not hold them for good."""
    monkeypatch.setattr(shared_module, "CLOSE_TIMEOUT", 0.1)

    async def scenario() -> Browser:
        shared = shared_browser(config(PLAYWRIGHT_LAUNCH_OPTIONS={"slow_mo": 2}), RecordingProvider)
        user = SharedProvider(shared)
        await user.start()
        browser = await user.launch_browser()
        shared.forget[1] = lambda _browser: [asyncio.sleep(3600)]  # a close that never ends
        await asyncio.wait_for(shared.recycle(), timeout=5)
        return browser

    with caplog.at_level(logging.WARNING, logger=shared_module.__name__):
        browser = asyncio.run(scenario())
    assert not browser.connected
    assert "did not close in 0.1 s" in caplog.text
