"""A render cancelled at its deadline while its page is being made gives the page's place
back (``celery_crawl.browser.handler.made_whole``). The browser's own part is driven in
tests/integration/test_browser.py; here a context stands in for scrapy-playwright's, which
takes a place before it asks for a page and gives it back when the page closes, or when
the ask raises an ``Exception`` (a cancel is not one)."""

from __future__ import annotations

import asyncio
from typing import Any

from celery_crawl.browser.handler import made_whole


class Page:
    def __init__(self, places: asyncio.Semaphore) -> None:
        self.places = places
        self.closed = False

    async def close(self) -> None:
        self.closed = True
        self.places.release()  # scrapy-playwright's close callback


class Context:
    """scrapy-playwright's ``_create_page``: its semaphore, around a slow ``new_page``."""

    def __init__(self, places: int, ask_seconds: float) -> None:
        self.places = asyncio.Semaphore(places)
        self.ask_seconds = ask_seconds
        self.pages: list[Page] = []

    async def create_page(self) -> Page:
        await self.places.acquire()
        try:
            await asyncio.sleep(self.ask_seconds)  # the browser makes the page
        except Exception:
            self.places.release()
            raise
        self.pages.append(Page(self.places))
        return self.pages[-1]


async def render(context: Context, closing: set[asyncio.Task[None]], timeout: float) -> Any:
    return await asyncio.wait_for(made_whole(context.create_page(), closing), timeout)


def test_a_page_whose_render_passed_its_deadline_while_it_was_made_is_closed() -> None:
    async def run() -> tuple[Context, set[asyncio.Task[None]]]:
        context, closing = Context(places=2, ask_seconds=0.2), set()
        for _ in range(2):  # both places: each render's deadline passes while its page is made
            try:
                await render(context, closing, timeout=0.05)
            except TimeoutError:
                pass
            else:
                raise AssertionError("the render should have passed its deadline")
        assert len(closing) == 2  # the pages are still being made, to be closed
        page = await render(context, closing, timeout=2.0)  # waits for a place given back
        assert not page.closed
        return context, closing

    context, closing = asyncio.run(run())
    assert [page.closed for page in context.pages] == [True, True, False]
    assert not closing  # the closers are done, and forgotten


def test_a_page_made_in_time_is_not_closed() -> None:
    async def run() -> tuple[Any, set[asyncio.Task[None]]]:
        context, closing = Context(places=1, ask_seconds=0.0), set()
        return await render(context, closing, timeout=1.0), closing

    page, closing = asyncio.run(run())
    assert not page.closed and not closing
