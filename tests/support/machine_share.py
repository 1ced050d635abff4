"""The machine shared out among pytest-xdist's workers: a test marked ``alone`` runs by itself.

Tests that measure time (a site's rate, a recovery within a bound, a ctrl-C answered within
three seconds) are marked ``alone``; under ``pytest -n N`` each of them waits until no other
test runs, and the others wait while it runs. Every other test takes a shared lock and runs
beside the rest. Two ``flock`` files in the session's temporary folder, which xdist's workers
share: a turnstile, so that a test waiting to run alone is not starved by shared ones that
keep coming, and the lock itself. Without xdist, nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ALONE = "alone"  # the marker (pyproject.toml)


def _folder(config: pytest.Config) -> Path | None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    # each xdist worker's base temp is <run folder>/popen-gwN: the run folder is shared
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return factory.getbasetemp().parent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    folder = _folder(item.config)
    if folder is None:
        yield
        return
    mode = fcntl.LOCK_EX if item.get_closest_marker(ALONE) else fcntl.LOCK_SH
    turnstile_path, lock_path = folder / "machine.turnstile", folder / "machine.lock"
    with turnstile_path.open("a") as turnstile, lock_path.open("a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, mode)  # setup, call and teardown: the test's processes too
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
