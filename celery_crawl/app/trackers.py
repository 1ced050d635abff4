"""Job tasks run beside the worker's pool, so that a job holds no pool slot.

A job task (``celery_crawl.crawl``) seeds its job, then watches it until it
ends: the crawling is done by the crawlers that every pool process hosts, and
the task mostly waits. Run in the pool, each job held a slot for its whole
crawl; with ``-c 1``, one job kept beat's producer runs, and every other task,
waiting until it ended.

:class:`JobTrackers`, a worker bootstep, sends the job tasks of its worker to
a :class:`TrackerPool` instead: daemon threads of the worker's main process, at
most ``CELERY_CRAWL_JOB_TRACKERS`` at once; a job task beyond them waits for a
thread, in order. A job task still goes through Celery's tracing and the
worker's request (``Request.execute_using_pool``), so its result, its STARTED
and PROGRESS states and its events (Flower), its late acknowledgement,
``revoke``, and its ``Reject`` at a warm shutdown are those of a pool task.

Job tasks are acknowledged late: while one runs or waits for a thread, its message
stays unacknowledged and would use up one of the consumer's prefetch slots. So each
job task raises the consumer's prefetch allowance by one, as Celery does for a task
held for its ETA, and lowers it again when it ends: a burst of jobs (a producer tick
that starts a thousand) never keeps beat's next ticks, or any other task, from being
fetched. Up to :data:`WAITING_PER_TRACKER` per thread wait that way; beyond, a job
task holds a prefetch slot while it waits, which bounds what a worker takes in.

A warm shutdown sets the pool's ``stopping`` event (:func:`shutting_down`), which
each running job task reads between its progress reports, in the process, so that
it needs no Redis: it hands its message back
(:func:`celery_crawl.app.tasks.run_job`). The shutdown waits for them at most
:data:`STOP_WAIT_SECONDS`, then goes on, leaving a stuck one's message
unacknowledged; a cold one does not wait, and the broker delivers their messages
again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from celery import bootsteps, signals

from celery_crawl.app.client import JOB_TASK
from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.hosting.project import project_of

logger = logging.getLogger(__name__)
# how long a warm shutdown waits for its running job tasks: each checks ``stopping``
# between reports, about a progress interval apart, longer while Redis does not answer
STOP_WAIT_SECONDS = 30.0
# job tasks that may wait for a thread, per thread, without holding a prefetch slot
WAITING_PER_TRACKER = 10
# the stop event of each worker's pool in this process, by the worker's hostname
_stopping: dict[str, threading.Event] = {}


def shutting_down(hostname: str) -> bool:
    """Whether the worker ``hostname`` of this process is shutting down (warm)."""
    stopping = _stopping.get(hostname)
    return stopping is not None and stopping.is_set()


def pause(hostname: str, seconds: float) -> None:
    """Sleep ``seconds``, or less if the worker ``hostname`` starts a warm shutdown."""
    stopping = _stopping.get(hostname)
    if stopping is None:
        time.sleep(seconds)
    else:
        stopping.wait(seconds)


class TrackerPool:
    """At most ``limit`` job tasks at once, each in a daemon thread; the others wait in order.

    ``qos`` gives the consumer's prefetch count (a ``kombu.common.QoS``) when a
    task comes in: it is raised by one until the task ends, for a task that runs
    and for up to ``WAITING_PER_TRACKER * limit`` that wait.

    Only ``apply_async`` is a pool's: the worker's request calls it.
    """

    def __init__(self, limit: int, qos: Callable[[], Any]) -> None:
        self.limit = limit
        self.qos = qos
        self._lock = threading.Lock()
        self._waiting: deque[Tracked] = deque()
        self._threads: set[threading.Thread] = set()
        self._closed = False
        self.stopping = threading.Event()  # set at a warm shutdown: the job tasks hand back

    def apply_async(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **_: Any,
    ) -> None:
        """Run ``target`` as a pool runs a task: ``accept_callback``, then ``callback(result)``."""
        from celery.concurrency.base import apply_target

        run = functools.partial(apply_target, target, args, kwargs, callback, accept_callback)
        with self._lock:
            if self._closed:  # shutting down: the broker delivers its message again
                return
            if len(self._threads) >= self.limit:
                counted = len(self._waiting) < self._bound
                self._waiting.append(Tracked(run, self._raise_prefetch() if counted else None))
                return
            tracked = Tracked(run, self._raise_prefetch())
            thread = threading.Thread(
                target=self._work, args=(tracked,), name="job-tracker", daemon=True
            )
            self._threads.add(thread)
        thread.start()

    @property
    def _bound(self) -> int:
        """How many waiting tasks raise the prefetch: the first ones in line."""
        return WAITING_PER_TRACKER * self.limit

    def _raise_prefetch(self) -> Any:
        """The consumer's prefetch count, raised by one; None while it has not connected."""
        qos = self.qos()
        if qos is not None:
            qos.increment_eventually()
        return qos

    def _work(self, tracked: Tracked | None) -> None:
        """Run a task, then the next waiting one, until none waits."""
        while tracked is not None:
            self._run(tracked)
            with self._lock:
                waiting = self._waiting and not self._closed
                tracked = self._waiting.popleft() if waiting else None
                if tracked is None:
                    self._threads.discard(threading.current_thread())
                    return
                self._count(tracked)
                if len(self._waiting) >= self._bound:  # one more in line within the bound
                    self._count(self._waiting[self._bound - 1])

    def _count(self, tracked: Tracked) -> None:
        """A task that came beyond the bound, now running or within it, holds no slot."""
        if tracked.qos is None:
            tracked.qos = self._raise_prefetch()

    def _run(self, tracked: Tracked) -> None:
        try:
            tracked.run()
        except BaseException:  # the request's callbacks failed: the thread goes on
            logger.exception("job task tracker: the task's callbacks failed")
        finally:
            tracked.done()

    def start(self) -> None:
        pass

    def stop(self, wait: float = STOP_WAIT_SECONDS) -> None:
        """Warm shutdown: wait for the running job tasks, which hand their jobs back.

        At most ``wait`` seconds in all: a job task still running then (stuck in a
        Redis call) ends with the process, its message unacknowledged.
        """
        deadline = time.monotonic() + wait
        running = self.close()
        for thread in running:
            thread.join(max(deadline - time.monotonic(), 0.0))
        stuck = sum(thread.is_alive() for thread in running)
        if stuck:
            logger.warning(
                "%d job tasks still running after %.0f s of warm shutdown: the worker exits"
                " without them; their messages stay unacknowledged, and the broker delivers"
                " them again",
                stuck,
                wait,
            )

    def terminate(self) -> None:
        """Cold shutdown: the running job tasks end with the process."""
        self.close()

    def close(self) -> list[threading.Thread]:
        """Take no more tasks; forget the waiting ones; the threads still running."""
        self.stopping.set()
        with self._lock:
            self._closed = True
            for tracked in self._waiting:
                tracked.done()
            self._waiting.clear()
            return list(self._threads)


class Tracked:
    """A job task for a tracker thread, and the prefetch count it raised (None: none)."""

    def __init__(self, run: Callable[[], Any], qos: Any) -> None:
        self.run = run
        self.qos = qos

    def done(self) -> None:
        if self.qos is not None:  # the same object: a reconnection makes a new one
            self.qos.decrement_eventually()
            self.qos = None


class JobTrackers(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep: the worker's job tasks run in a :class:`TrackerPool`, not its pool.

    It wraps the worker's ``process_task``, which the consumer calls with every
    request it will run (at once, after an ETA, or after a rate limit), once the
    pool is built and before the consumer is.
    """

    label = "Job trackers"
    requires = ("celery.worker.components:Pool",)

    def create(self, worker: Any) -> TrackerPool:
        limit = setting(project_of(worker.app).settings, "CELERY_CRAWL_JOB_TRACKERS")
        if limit < 1:
            raise ConfigError(f"CELERY_CRAWL_JOB_TRACKERS = {limit}: give at least 1")
        trackers = TrackerPool(limit, lambda: getattr(worker.consumer, "qos", None))
        worker.process_task = route_jobs(worker.process_task, trackers)
        hostname = str(worker.hostname)
        _stopping[hostname] = trackers.stopping

        def on_shutting_down(sender: Any = None, **_: Any) -> None:
            if str(sender) == hostname:  # before the consumer stops: the tasks start handing back
                trackers.stopping.set()

        signals.worker_shutting_down.connect(on_shutting_down, weak=False)
        return trackers


def route_jobs(process_task: Callable[[Any], Any], trackers: TrackerPool) -> Callable[[Any], Any]:
    """``process_task`` for every request but a job task's, which ``trackers`` runs."""
    from celery.exceptions import TaskRevokedError
    from celery.worker.request import Request

    def process(request: Any) -> Any:
        if request.name != JOB_TASK:
            return process_task(request)
        # as the worker's own process_task does, a revoked request is dropped here;
        # the generic method, for the worker's request class is bound to its own pool
        with contextlib.suppress(TaskRevokedError):
            Request.execute_using_pool(request, trackers)
        return None

    return process
