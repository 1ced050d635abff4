"""TrackerPool: at most its limit of tasks at once, the others in order, the prefetch raised."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from kombu.common import QoS

from celery_crawl.app.trackers import WAITING_PER_TRACKER, TrackerPool


def settle(check: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.01)


def test_at_most_the_limit_runs_at_once_each_raising_the_prefetch_by_one() -> None:
    qos = QoS(lambda prefetch_count: None, 4)  # type: ignore[no-untyped-call]
    trackers = TrackerPool(2, lambda: qos)
    release = threading.Event()
    started: queue.Queue[int] = queue.Queue()
    accepted: list[int] = []
    ended: queue.Queue[int] = queue.Queue()

    def task(number: int) -> int:
        started.put(number)
        release.wait(10)
        return number

    for number in range(3):
        trackers.apply_async(
            task,
            args=(number,),
            callback=ended.put,
            accept_callback=lambda pid, when: accepted.append(pid),
        )
    assert sorted([started.get(timeout=10), started.get(timeout=10)]) == [0, 1]
    assert started.empty()  # the third waits for a thread
    # two running job tasks and one waiting: three more messages may come in, so that
    # a burst of jobs keeps no other task (beat's next producer tick) from being fetched
    assert qos.value == 7
    release.set()
    assert sorted(ended.get(timeout=10) for _ in range(3)) == [0, 1, 2]
    assert started.get(timeout=10) == 2 and len(accepted) == 3
    settle(lambda: qos.value == 4)


def test_beyond_its_bound_a_waiting_task_holds_a_prefetch_slot() -> None:
    """What a worker takes in stays bounded: past WAITING_PER_TRACKER per thread, a waiting
    job task raises the prefetch no more."""
    qos = QoS(lambda prefetch_count: None, 4)  # type: ignore[no-untyped-call]
    trackers = TrackerPool(2, lambda: qos)
    first, last = threading.Event(), threading.Event()
    for _ in range(2 + 2 * WAITING_PER_TRACKER):
        trackers.apply_async(lambda: first.wait(10))
    for _ in range(5):
        trackers.apply_async(lambda: last.wait(10))
    assert qos.value == 4 + 2 + 2 * WAITING_PER_TRACKER
    first.set()
    # the five that came beyond the bound: once they run, or wait within it, they count
    settle(lambda: len(trackers._waiting) == 3)
    settle(lambda: qos.value == 4 + 2 + 3)
    last.set()
    settle(lambda: qos.value == 4 and not trackers._threads)


def test_a_closed_pool_forgets_its_waiting_tasks_and_returns_its_running_threads() -> None:
    qos = QoS(lambda prefetch_count: None, 4)  # type: ignore[no-untyped-call]
    trackers = TrackerPool(1, lambda: qos)
    release, ran = threading.Event(), list[str]()
    trackers.apply_async(lambda: release.wait(10) and "running", callback=ran.append)
    trackers.apply_async(lambda: "waiting", callback=ran.append)
    running = trackers.close()
    trackers.apply_async(lambda: "after close", callback=ran.append)
    release.set()
    for thread in running:
        thread.join(10)
    assert len(running) == 1 and not running[0].is_alive()
    assert ran == ["running"]
    assert qos.value == 4


def test_a_warm_stop_signals_its_tasks_in_process_and_waits_for_them_only_so_long(
    caplog: Any,
) -> None:
    """A job task stuck (in a Redis call) does not hold the shutdown for ever; the others
    see ``stopping`` at once, with no Redis."""
    trackers = TrackerPool(2, lambda: None)
    stuck, seen = threading.Event(), queue.Queue[bool]()
    trackers.apply_async(lambda: stuck.wait(30))
    trackers.apply_async(lambda: seen.put(trackers.stopping.wait(10)))
    settle(lambda: len(trackers._threads) == 2)  # both running
    trackers.stop(wait=0.5)
    stuck_alive = any(thread.is_alive() for thread in trackers._threads)
    stuck.set()
    assert seen.get(timeout=10) is True
    # stop() returned with the stuck task still running: the old stop joined with no limit
    assert stuck_alive
    assert "1 job tasks still running after 0 s of warm shutdown" in caplog.text
