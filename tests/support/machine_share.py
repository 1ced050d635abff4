"""The machine shared out among pytest-xdist's workers: an ``alone`` test goes first.

Tests that measure time (a site's rate, a recovery within a bound, a ctrl-C answered within
three seconds) are marked ``alone``. Under ``pytest -n N`` each of them runs while no other
``alone`` test does, and first in line for the CPUs: while it runs, every thread of the test
session's other processes is in ``SCHED_IDLE`` (``sched_setscheduler``), so that they run
only on a CPU that its xdist worker's processes (the test's Celery workers, servers and
sites, and the xdist worker's embedded server) leave idle, and give it up as soon as one of
those wakes; when it ends, they are set back to ``SCHED_OTHER``. A process or thread started
meanwhile has the policy of its parent. So the other tests go on beside it with what it
leaves, and it measures what it would on an empty machine (:data:`IDLE_OTHERS`).

Setting a thread back from ``SCHED_IDLE`` takes root (or ``CAP_SYS_NICE``); CI runs as root.
Without it, an ``alone`` test runs on a CPU of its own instead: its xdist worker's processes
are pinned to the first CPU the session may use, and every other process of the session to
the others (``sched_setaffinity``), until it ends.

A test that needs more than one CPU to measure what it measures (four Celery workers holding
two sites to their rates, a crawl beside them at full speed) is marked
``alone(machine=True)``: it runs while no other test does (every test holds the machine's
lock, shared; this one takes it alone, through the turnstile). Beside other tests, even idle
ones, its crawls' spans varied too much: its measurements failed and were run again. A
worker keeps the machine from one such test to the next in the collection, so that the
machine is emptied once for the pair, not at each test.

With a single CPU an ``alone`` test waits instead until no other test runs, and the others
wait while it runs (a shared ``flock``, and a turnstile so that it is not starved). Without
xdist, nothing is pinned or locked.

The ``alone`` tests are collected first, one after another, so that the first worker runs
them in a row (xdist's ``worksteal`` distribution, ``addopts``, gives each worker a
contiguous share of the collection). The ``alone(machine=True)`` ones come first of all,
and every other worker's first test waits until the first of them holds the machine: the
run starts with them, and the machine is emptied for them without waiting for a long test
to end.

Tests that drive Chromium and measure nothing are marked ``browser``: one of them at a time
(a lock of their own), beside the others but never beside an ``alone`` test.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.support.procs import descendants

ALONE = "alone"  # the markers (pyproject.toml)
BROWSER = "browser"
# the CPUs this process may use, read once when it starts, before any test pins it: while
# another worker's alone test runs, this process is pinned to the others, and a test that
# asked then would see one CPU and lock as on a single-CPU machine, beside the pinned test
CPUS = frozenset(os.sched_getaffinity(0))


def _alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker(ALONE) is not None


def _whole_machine(item: pytest.Item) -> bool:
    marker = item.get_closest_marker(ALONE)
    return marker is not None and bool(marker.kwargs.get("machine", False))


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
    """The ``alone(machine=True)`` tests first, then the other ``alone`` tests, then the
    ``browser`` ones, each in their order; then the others, in theirs."""
    whole = [item for item in items if _alone(item) and _whole_machine(item)]
    alone = [item for item in items if _alone(item) and not _whole_machine(item)]
    browser = [item for item in items if _browser(item) and not _alone(item)]
    first = {id(item) for item in whole + alone + browser}
    items[:] = whole + alone + browser + [item for item in items if id(item) not in first]
    _whole_first[:] = [bool(whole)]


# whether this process's collection starts with alone(machine=True) tests (then its first
# other test waits until one of those holds the machine), and how long it waits at most
_whole_first: list[bool] = [False]
WHOLE_WAIT_SECONDS = 60.0


def _whole_started(folder: Path) -> Path:
    return folder / "machine.whole-started"


def _wait_for_whole(folder: Path) -> None:
    """Before this process's first test that is not ``alone(machine=True)``: until the first
    of those holds the machine (or :data:`WHOLE_WAIT_SECONDS`), so that it need not wait
    for a test another worker started first. At the start every worker reaches its first
    test at about the same moment, and the whole-machine tests' worker would win the
    turnstile only now and then."""
    if not _whole_first[0]:
        return
    _whole_first[0] = False
    deadline = time.monotonic() + WHOLE_WAIT_SECONDS
    while not _whole_started(folder).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _take(folder: Path, alone: bool) -> IO[str]:
    """The machine's lock, shared or alone, taken through the turnstile. Taken alone, it
    says so to the workers that wait for the first whole-machine test (:func:`_wait_for_whole`):
    the whole-machine tests are collected first, so the first to take it alone is one."""
    lock = (folder / "machine.lock").open("a")
    with (folder / "machine.turnstile").open("a") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
    if alone:
        _whole_started(folder).touch()
    return lock


def _take_browser(folder: Path) -> IO[str]:
    """The browser tests' lock: one browser test at a time."""
    browser = (folder / "browser.lock").open("a")
    fcntl.flock(browser, fcntl.LOCK_EX)
    return browser


def _give_back(lock: IO[str] | None) -> None:
    if lock is not None:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def _tree(root: int) -> set[int]:
    """``root`` and every process below it."""
    return {root} | descendants(root)


def _pin(session: set[int], own: set[int], cpus: set[int], others: set[int]) -> None:
    """``own`` processes to ``cpus``, the rest of ``session`` to ``others``: each of their
    threads, as Linux keeps an affinity per thread (a process's own is its main thread's)."""
    for pid in session:
        for tid in _threads(pid):
            with contextlib.suppress(OSError):  # ended meanwhile
                os.sched_setaffinity(tid, cpus if pid in own else others)


@contextlib.contextmanager
def _cpu_of_its_own() -> Iterator[None]:
    """This xdist worker's processes on the first CPU, the session's others on the rest,
    until the block ends."""
    every = set(CPUS)
    first = {min(every)}
    session = os.getppid()  # the xdist controller, whose children are the workers
    _pin(_tree(session), _tree(os.getpid()), first, every - first)
    try:
        yield
    finally:
        tree = _tree(session)
        _pin(tree, tree, every, every)


def _threads(pid: int) -> list[int]:
    """The ids of ``pid``'s threads: Linux schedules each thread by a policy of its own."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # ended meanwhile
        return []


def _schedule(pids: set[int], policy: int) -> None:
    for pid in pids:
        for tid in _threads(pid):
            with contextlib.suppress(OSError):  # ended meanwhile
                os.sched_setscheduler(tid, policy, os.sched_param(0))


def _may_idle_others() -> bool:
    """Whether a thread set to ``SCHED_IDLE`` may be set back (root, or ``CAP_SYS_NICE``)."""
    result: list[bool] = []
    probe = threading.Thread(target=_idle_and_back, args=(result,))
    probe.start()
    probe.join()
    return result == [True]


def _idle_and_back(result: list[bool]) -> None:
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
    except OSError:  # not permitted (no root), or no such policy here
        result.append(False)
    else:
        result.append(True)


@contextlib.contextmanager
def _others_idle() -> Iterator[None]:
    """Every thread of the session's other processes in ``SCHED_IDLE`` until the block ends:
    they run only on a CPU that this xdist worker's processes leave idle, and give it up
    as soon as one of those wakes. A process or thread started meanwhile inherits the
    policy of its parent. This worker's own processes are set to ``SCHED_OTHER`` first: one
    forked while an earlier test set the others back may have been missed."""
    session = os.getppid()  # the xdist controller, whose children are the workers
    own = _tree(os.getpid())
    _schedule(own, os.SCHED_OTHER)
    _schedule(_tree(session) - own - {session}, os.SCHED_IDLE)
    try:
        yield
    finally:
        _schedule(_tree(session) - _tree(os.getpid()), os.SCHED_OTHER)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    folder = _folder(item.config)
    if folder is None:
        yield
        return
    if not _whole_machine(item):
        _wait_for_whole(folder)
    if len(CPUS) > 1:
        yield from _run_pinned(folder, item, nextitem)
        return
    lock = _take(folder, _alone(item))
    try:
        yield  # setup, call and teardown: the test's processes too
    finally:
        _give_back(lock)


class _Kept:
    """The machine's lock, kept from a whole-machine test to the next one of this process.

    Between two such tests, another worker's long test could start, and the next one would
    wait for it with the machine half idle (the turnstile lets no one else start). A lock
    kept is given back if no test takes it within :data:`KEEP_SECONDS`: this worker may wait
    for the controller, or the session may stop (``-x``), and must not hold the machine
    meanwhile.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: IO[str] | None = None
        self._timer: threading.Timer | None = None

    def take(self) -> IO[str] | None:
        """The kept lock, now the caller's; None if none is kept."""
        with self._lock:
            held, self._held = self._held, None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return held

    def keep(self, lock: IO[str]) -> None:
        with self._lock:
            self._held = lock
            self._timer = threading.Timer(KEEP_SECONDS, self.give_back)
            self._timer.daemon = True
            self._timer.start()

    def give_back(self) -> None:
        _give_back(self.take())


KEEP_SECONDS = 10.0
_kept = _Kept()
IDLE_OTHERS = _may_idle_others()


def _whole_machine_next(nextitem: pytest.Item | None) -> bool:
    return nextitem is not None and _whole_machine(nextitem) and not _browser(nextitem)


def _run_pinned(folder: Path, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """An ``alone`` test one at a time, first for every CPU while the others run idle
    (:data:`IDLE_OTHERS`), else on a CPU of its own; ``alone(machine=True)``, while no other
    test runs. A browser test, one at a time and never beside an ``alone`` test (Chromium
    on one CPU shared with the other tests missed its render deadlines); any other test as
    it comes. The locks are taken in one order: browser, machine, pinning."""
    whole = _whole_machine(item)
    pinned = _alone(item) and not whole
    kept = _kept.take()
    if kept is not None and not whole:
        _give_back(kept)
        kept = None
    locks = []
    try:
        if _browser(item) and not _alone(item):
            locks.append(_take_browser(folder))
        locks.append(kept if kept is not None else _take(folder, whole))
        if pinned or _browser(item):
            pinning = (folder / "pinning.lock").open("a")
            fcntl.flock(pinning, fcntl.LOCK_EX if pinned else fcntl.LOCK_SH)
            locks.append(pinning)
        if pinned:
            with _others_idle() if IDLE_OTHERS else _cpu_of_its_own():
                yield
        else:
            yield
    finally:
        if whole and locks and not _browser(item) and _whole_machine_next(nextitem):
            _kept.keep(locks.pop(0))  # the machine's lock: the only one a whole test takes
        for lock in reversed(locks):
            _give_back(lock)
