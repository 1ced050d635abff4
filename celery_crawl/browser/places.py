"""Pages made for renders that a deadline can cancel, and the places they take.

scrapy-playwright's ``_create_page`` takes a place among its context's
``PLAYWRIGHT_MAX_PAGES_PER_CONTEXT`` (the context's semaphore), then asks the browser for
a page. The place comes back when the page closes, or when the ask raises an
``Exception``. A render cancelled at its deadline (``BROWSER_RENDER_TIMEOUT``) raises
neither, so :class:`PageMakings` decides what becomes of its page's making:

- **While it waits for a place**, it holds none: it stops at once. A making that went on
  waiting would take the next free place ahead of the renders still wanted. Under load,
  every render would then pass its deadline behind such makings, and none would render.
- **Once it holds a place**, the browser is making the page: the page is made, then
  closed, which gives the place back.
- **Before it waits** (its context, or the browser, is being started, or waits its turn
  to be), it goes on, since a context or a browser cut off half-made would be lost; it
  stops when it comes to wait for a place. (A context it waited to start, among
  ``PLAYWRIGHT_MAX_CONTEXTS`` when that is set, is started all the same.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Literal

from playwright.async_api import Error as PlaywrightError

if TYPE_CHECKING:
    from collections.abc import Coroutine

logger = logging.getLogger(__name__)
STOP_SECONDS = 10.0  # a cancelled render may take this long to stop before it is left behind
CLOSE_SECONDS = 10.0  # a page may take this long to close before it is left to its browser


class PageMakings:
    """The pages one download handler is making, for renders that may be cancelled, in
    every context of the handler (one set of each for all of them)."""

    def __init__(self) -> None:
        self.waiting: set[asyncio.Task[Any]] = set()  # makings waiting for a place
        self.given_up: set[asyncio.Task[Any]] = set()  # makings whose render is gone
        self.closing: set[asyncio.Task[None]] = set()  # pages made for a render gone

    def places(self, count: int) -> PagePlaces:
        """A new context's places, to stand for scrapy-playwright's semaphore."""
        return PagePlaces(count, self)

    async def made(self, creating: Coroutine[Any, Any, Any]) -> Any:
        """The page ``creating`` (scrapy-playwright's ``_create_page``) makes, in a task
        of its own that a cancel of the caller does not cut short while it holds a place."""
        task = asyncio.ensure_future(creating)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._give_up(task)
            raise

    def _give_up(self, task: asyncio.Task[Any]) -> None:
        if task in self.waiting:
            task.cancel()  # it holds no place: it stops waiting, and no page is made
            return
        self.given_up.add(task)  # it will not wait for a place (PagePlaces.acquire)
        task.add_done_callback(self.given_up.discard)
        closer = asyncio.ensure_future(_close_when_made(task))
        self.closing.add(closer)
        closer.add_done_callback(self.closing.discard)


class PagePlaces(asyncio.Semaphore):
    """A context's places among ``PLAYWRIGHT_MAX_PAGES_PER_CONTEXT``, which a making
    given up never waits for."""

    def __init__(self, count: int, makings: PageMakings) -> None:
        super().__init__(count)
        self.makings = makings

    async def acquire(self) -> Literal[True]:
        task = asyncio.current_task()
        if task is None:
            return await super().acquire()
        if task in self.makings.given_up:
            raise asyncio.CancelledError  # its render is gone: no place, no page
        self.makings.waiting.add(task)
        try:
            return await super().acquire()
        finally:
            self.makings.waiting.discard(task)


async def _close_when_made(task: asyncio.Task[Any]) -> None:
    try:  # shielded: a cancel of this closer must not cut the making short
        page = await asyncio.shield(task)
    except (Exception, asyncio.CancelledError):  # no page, and its place given back
        return
    await closed(page, "a page made too late")  # which gives its place back


async def closed(page: Any, what: str) -> bool:
    """Whether ``page`` closed, within :data:`CLOSE_SECONDS`; one that does not close in
    time is logged, and left to its browser. Its browser gone, so is the page."""
    try:
        await asyncio.wait_for(page.close(), timeout=CLOSE_SECONDS)
    except PlaywrightError:  # its browser is gone: so is the page
        return False
    except TimeoutError:
        logger.warning("browser: %s did not close in %g s", what, CLOSE_SECONDS)
        return False
    return True


async def within(render: Coroutine[Any, Any, Any], seconds: float, what: str) -> Any:
    """``render``'s result, if it comes within ``seconds``; else ``TimeoutError``, once
    the render, cancelled, has stopped. A render that does not stop within
    :data:`STOP_SECONDS` is left behind, and where it is stuck is logged: the deadline
    holds even then. Cancelled itself, it cancels the render and returns at once."""
    task = asyncio.ensure_future(render)
    # a render left behind may fail later, with nobody to await it (the shield below
    # forgets it once cancelled): its error is taken here, not logged as never retrieved
    task.add_done_callback(lambda ended: ended.cancelled() or ended.exception())
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout=seconds)
    except TimeoutError:
        task.cancel()
        await asyncio.wait({task}, timeout=STOP_SECONDS)
        if task.done() and not task.cancelled():
            return task.result()  # it ended as it was cancelled: its own end
        if not task.done():
            logger.warning(
                "browser: %s was cancelled at its deadline but has not stopped after"
                " %g s; left behind, waiting in %s",
                what,
                STOP_SECONDS,
                waiting_in(task),
            )
        raise
    finally:
        task.cancel()  # cancelled itself, or left behind: a no-op once the render ended


def waiting_in(task: asyncio.Task[Any]) -> str:
    """The innermost coroutines ``task`` awaits, outer first, as ``function (file:line)``."""
    coroutine: Any = task.get_coro()
    chain: list[str] = []
    while coroutine is not None:
        frame = getattr(coroutine, "cr_frame", None)
        if frame is not None:
            chain.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})")
        coroutine = getattr(coroutine, "cr_await", None)
    return " > ".join(chain[-3:]) or "?"
