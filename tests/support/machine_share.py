"""The machine shared out among pytest-xdist's workers: a test marked ``alone`` runs by itself.

Tests that measure time (a site's rate, a recovery within a bound, a ctrl-C answered within
three seconds) are marked ``alone``; under ``pytest -n N`` each of them waits until no other
test runs, and the others wait while it runs. Every other test takes a shared lock and runs
beside the rest. ``flock`` files in the session's temporary folder, which xdist's workers
share: a turnstile, so that a test waiting to run alone is not starved by shared ones that
keep coming, the machine's lock itself, and the browser tests' lock (below). Without
xdist, nothing is locked.

Waiting for the machine to empty costs the other workers the rest of the tests they are
running, each time. So the ``alone`` tests are collected first, one after another, and a
worker keeps the machine to itself from one of them to the next: with xdist's ``worksteal``
distribution (``addopts``), the first worker runs them all in one stretch, and the machine
is emptied about once.

Tests that drive Chromium and measure nothing are marked ``browser`` instead: one of them
at a time (a third lock, taken before the machine's, so that a test waiting for it holds
nothing), beside the shared tests. They are collected right after the ``alone`` ones, so
that the first worker runs them in a row too.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

ALONE = "alone"  # the markers (pyproject.toml)
BROWSER = "browser"

_kept: list[IO[str]] = []  # the lock, still held alone, for this worker's next test


def _alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker(ALONE) is not None


def _browser(item: pytest.Item) -> bool:
    return item.get_closest_marker(BROWSER) is not None


def _folder(config: pytest.Config) -> Path | None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    # each xdist worker's base temp is <run folder>/popen-gwN: the run folder is shared
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return factory.getbasetemp().parent


@pytest.hookimpl(trylast=True)  # after the conftest's markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``alone`` tests first, then the ``browser`` ones, each in their order; then the
    others, in theirs."""
    alone = [item for item in items if _alone(item)]
    browser = [item for item in items if _browser(item) and not _alone(item)]
    first = {id(item) for item in alone + browser}
    items[:] = alone + browser + [item for item in items if id(item) not in first]


def _take(folder: Path, alone: bool) -> IO[str]:
    """The machine's lock, shared or alone, taken through the turnstile."""
    lock = (folder / "machine.lock").open("a")
    with (folder / "machine.turnstile").open("a") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
    return lock


def _take_browser(folder: Path) -> IO[str]:
    """The browser tests' lock, taken before the machine's: waiting, this worker holds
    nothing, not even the machine kept from an alone test (given back first)."""
    while _kept:
        _give_back(_kept.pop())
    browser = (folder / "browser.lock").open("a")
    fcntl.flock(browser, fcntl.LOCK_EX)
    return browser


def _give_back(lock: IO[str] | None) -> None:
    if lock is not None:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    folder = _folder(item.config)
    if folder is None:
        yield
        return
    browser = _take_browser(folder) if _browser(item) and not _alone(item) else None
    try:
        # kept from an alone test before: still alone, which serves any test
        lock = _kept.pop() if _kept else _take(folder, _alone(item))
    except BaseException:
        _give_back(browser)
        raise
    try:
        yield  # setup, call and teardown: the test's processes too
    finally:
        _give_back(browser)
        if _alone(item) and _alone(nextitem):
            _kept.append(lock)  # the next test runs alone too: the machine stays empty
        else:
            _give_back(lock)
