"""The module locks a forked pool child takes are usable in it, whatever the parent's threads held.

A prefork worker forks its children (at start, and to replace one) while its job
tracker threads run; a child forked while a tracker held one of these locks (in
``get_redis``, say) inherited it held, with no thread left to release it.
"""

from __future__ import annotations

import os
import threading
import time
from types import ModuleType

import pytest

from celery_crawl.core import connection, heartbeat, notices
from celery_crawl.hosting import host as hosting

LOCKS = [
    (connection, "_lock"),
    (notices, "_processes_lock"),
    (heartbeat, "_beats_lock"),
    (hosting, "_setup_lock"),
]


@pytest.mark.parametrize(("module", "name"), LOCKS, ids=[n for _, n in LOCKS])
def test_a_child_forked_while_a_thread_holds_the_lock_can_take_it(
    module: ModuleType, name: str
) -> None:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with getattr(module, name):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child: only this thread; exit 0 if it can take the lock
            os._exit(0 if getattr(module, name).acquire(timeout=5) else 1)
        status = wait_for_child(pid, seconds=30)
    finally:
        release.set()
        holder.join(10)
    assert os.waitstatus_to_exitcode(status) == 0, "the child could not take the lock"


def wait_for_child(pid: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the child did not exit")
