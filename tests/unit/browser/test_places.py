"""Renders cancelled at their deadline, and the pages and places their makings take
(``celery_crawl.browser.places``). The browser's own part is driven in
tests/integration/test_browser.py; here a context stands in for scrapy-playwright's
``_create_page``: it may first start its context, then takes a place, asks for a page,
and gives the place back when the page closes or when the ask raises an ``Exception``
(a cancel is not one)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from celery_crawl.browser import places as places_module
from celery_crawl.browser.places import PageMakings, within


class Page:
    def __init__(self, places: asyncio.Semaphore) -> None:
        self.places = places
        self.closed = False

    async def close(self) -> None:
        self.closed = True
        self.places.release()  # scrapy-playwright's close callback


class Context:
    """scrapy-playwright's ``_create_page`` on one context, whose semaphore is the
    makings' places, as ``BrowserDownloadHandler._create_browser_context`` sets it."""

    def __init__(self, makings: PageMakings, places: int, ask: float, start: float = 0.0):
        self.places = makings.places(places)
        self.ask, self.start = ask, start
        self.pages: list[Page] = []

    async def create_page(self) -> Page:
        await asyncio.sleep(self.start)  # the context (or the browser) being started
        await self.places.acquire()
        try:
            await asyncio.sleep(self.ask)  # the browser makes the page
        except Exception:
            self.places.release()
            raise
        self.pages.append(Page(self.places))
        return self.pages[-1]


async def render(context: Context, makings: PageMakings, timeout: float) -> Any:
    return await asyncio.wait_for(makings.made(context.create_page()), timeout)


async def past_deadline(context: Context, makings: PageMakings, timeout: float) -> None:
    try:
        await render(context, makings, timeout)
    except TimeoutError:
        return
    raise AssertionError("the render should have passed its deadline")


def test_a_page_whose_render_passed_its_deadline_while_it_was_made_is_closed() -> None:
    async def run() -> tuple[Context, PageMakings]:
        makings = PageMakings()
        context = Context(makings, places=2, ask=0.4)
        for _ in range(2):  # both places: each render's deadline passes while its page is made
            await past_deadline(context, makings, timeout=0.05)
        assert len(makings.closing) == 2  # the pages are still being made, to be closed
        page = await render(context, makings, timeout=5.0)  # waits for a place given back
        assert not page.closed
        return context, makings

    context, makings = asyncio.run(run())
    assert [page.closed for page in context.pages] == [True, True, False]
    assert not makings.closing and not makings.given_up  # done, and forgotten


def test_renders_that_passed_their_deadline_waiting_for_a_place_make_no_page() -> None:
    """They stop waiting: the next render wanted takes the place given back first, not
    after one page made and closed for each render gone."""

    async def run() -> tuple[Context, PageMakings, Page]:
        makings = PageMakings()
        context = Context(makings, places=1, ask=0.1)
        held = await render(context, makings, timeout=5.0)
        for _ in range(5):
            await past_deadline(context, makings, timeout=0.05)
        assert not makings.waiting and not makings.closing
        await held.close()
        return context, makings, await render(context, makings, timeout=5.0)

    context, makings, page = asyncio.run(run())
    # the held page, then this one: none made (and closed) for the renders gone
    assert len(context.pages) == 2 and context.pages[-1] is page
    assert not page.closed and not makings.given_up


def test_a_making_given_up_before_it_waits_for_a_place_never_takes_one() -> None:
    """Its context is still being started at the deadline: that goes on, then it stops
    where it would wait for a place, and the place stays free."""

    async def run() -> tuple[Context, PageMakings]:
        makings = PageMakings()
        context = Context(makings, places=1, ask=0.0, start=0.1)
        await past_deadline(context, makings, timeout=0.02)
        assert len(makings.given_up) == 1
        await asyncio.sleep(0.3)  # past the start, where it would have taken the place
        assert not makings.given_up and not makings.closing
        assert not context.places.locked()
        return context, makings

    context, _makings = asyncio.run(run())
    assert context.pages == []


def test_a_page_made_in_time_is_not_closed() -> None:
    async def run() -> tuple[Any, PageMakings]:
        makings = PageMakings()
        return await render(Context(makings, places=1, ask=0.0), makings, 1.0), makings

    page, makings = asyncio.run(run())
    assert not page.closed and not makings.closing


async def slow(stopped: list[bool]) -> None:
    """A render of 10 s, which notes in ``stopped`` that it was cancelled."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        stopped.append(True)
        raise


def test_within_gives_the_result_in_time_and_stops_a_render_past_it() -> None:
    stopped: list[bool] = []

    async def run() -> str:
        with pytest.raises(TimeoutError):
            await within(slow(stopped), 0.05, "the slow render")
        assert stopped == [True]  # stopped before the deadline's error was raised
        return str(await within(asyncio.sleep(0, "rendered"), 5.0, "the quick render"))

    assert asyncio.run(run()) == "rendered"


def test_within_cancelled_itself_cancels_the_render_at_once() -> None:
    """Scrapy cancels a download (its engine closing): the render stops with it."""
    stopped: list[bool] = []

    async def run() -> None:
        waiting = asyncio.ensure_future(within(slow(stopped), 5.0, "the slow render"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.sleep(0)  # the render's own step, with its cancel
        assert stopped == [True]  # now, not when the loop closes and cancels what is left

    asyncio.run(run())


def test_a_render_that_does_not_stop_is_left_behind_and_where_it_waits_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(places_module, "STOP_SECONDS", 0.1)
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await release.wait()  # a cancel it does not heed

    async def run() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await within(stubborn(), 0.05, "the stubborn render")
        took = loop.time() - started
        release.set()  # let it end, so that the loop closes clean
        await asyncio.sleep(0.01)
        return took

    with caplog.at_level(logging.WARNING, logger=places_module.__name__):
        took = asyncio.run(run())
    assert took < 3.0  # the deadline and the wait to stop (0.15 s), not the render's own
    [record] = caplog.records
    assert "the stubborn render" in record.getMessage()
    assert "stubborn (" in record.getMessage()  # where it waits: the coroutine and its line
