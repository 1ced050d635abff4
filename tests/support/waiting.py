"""Bounded waits: every loop of the tests that polls for a condition ends, and says what it
waited for when it gives up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], object], timeout: float, what: str, every: float = 0.05) -> float:
    """Poll ``check`` every ``every`` s until it holds; the seconds it took. Raises
    ``AssertionError`` naming ``what`` after ``timeout`` s."""
    started = time.monotonic()
    while True:
        if check():
            return time.monotonic() - started
        if time.monotonic() - started >= timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(every)


def wait_for_value(
    read: Callable[[], T | None], check: Callable[[T], bool], timeout: float, what: str
) -> T:
    """Poll ``read`` every 0.1 s until it gives a value that ``check`` accepts; that value.
    Raises ``AssertionError`` naming ``what`` and the last value read after ``timeout`` s."""
    deadline, value = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        value = read()
        if value is not None and check(value):
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}; last: {value!r}")
