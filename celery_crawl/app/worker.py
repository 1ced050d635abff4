"""The worker side of a celery_crawl app: a bootstep that hosts the crawlers.

``create_app`` adds :class:`CrawlerHosting` to its app's worker blueprint, so
only a worker of that app is touched, and only once it is built. The step:

- hosts the project's crawlers (:class:`celery_crawl.hosting.host.CrawlerHost`) in
  every process that runs tasks: in each prefork child after the fork
  (``worker_process_init``), or in the worker's own process for the solo and
  threads pools (``worker_ready``, once logging is configured); a worker whose
  crawlers cannot open stops instead of idling without them;
- gives the worker the Redis broker transport that survives a broker restart
  (:mod:`celery_crawl.app.broker`), before its consumer connects;
- flags a warm shutdown in Redis, so the worker's job trackers hand their
  tasks back to the broker (``worker_shutting_down``);
- closes the crawlers at shutdown, handing their leases back;
- makes ``revoke`` of a job task (Flower, ``AsyncResult.revoke``) cancel the
  job in Redis instead of terminating a process (:func:`cooperative_revoke`).

Celery's signals are process-wide, so every handler checks that the signal
is about this step's worker (by hostname or sender) before acting.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from typing import Any, ClassVar

import redis
from celery import bootsteps, signals

from celery_crawl.app import broker
from celery_crawl.app.client import find_job
from celery_crawl.core import connection
from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import RedisUnavailable
from celery_crawl.core.keys import stopping_worker
from celery_crawl.hosting.host import CrawlerHost
from celery_crawl.hosting.project import Project, project_of
from celery_crawl.jobs import logcontext

logger = logging.getLogger(__name__)
# the waits between tries to reach Redis before the crawlers open: doubling from the first
OPEN_RETRY_FIRST = 1.0
OPEN_RETRY_MOST = 10.0
# seconds a prefork child may take beyond its wait for Redis: one opening (60 s at
# most) and the closing of a half-opened one (10 s at most), with room to spare
OPEN_ALLOWANCE = 90.0
# seconds a worker's shutdown gives its crawlers to stop and hand back their leases
HOSTING_STOP_SECONDS = 60.0


class CrawlerHosting(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker bootstep: crawlers in every pool process, a cooperative ``revoke``."""

    label = "Crawler hosting"
    # the process-wide signals this step listens to, with the handler's name
    listens: ClassVar[dict[str, str]] = {
        "worker_process_init": "_on_process_init",
        "worker_process_shutdown": "_on_process_shutdown",
        "worker_ready": "_on_ready",
        "worker_shutting_down": "_on_shutting_down",
        "worker_shutdown": "_on_shutdown",
    }

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.worker = worker
        self.app = worker.app
        self.hostname = str(worker.hostname)
        self.host: CrawlerHost | None = None
        for name, handler in self.listens.items():
            getattr(signals, name).connect(getattr(self, handler), weak=False)
        install_cooperative_revoke(self.app)
        conf = self.app.conf
        conf.broker_transport = broker.worker_transport(conf.broker_url, conf.broker_transport)
        # a prefork child opens its crawlers before it reports to its parent, which kills
        # a child not up within this: long enough for the wait for Redis and the opening
        patience = setting(self.project.settings, "CELERY_CRAWL_OPEN_REDIS_WAIT_SECONDS")
        conf.worker_proc_alive_timeout = max(
            float(conf.worker_proc_alive_timeout or 0), patience + OPEN_ALLOWANCE
        )

    @property
    def project(self) -> Project:
        return project_of(self.app)

    def _on_process_init(self, sender: Any = None, **_: Any) -> None:
        """In each prefork child, and once in the solo pool's process."""
        if str(sender) != self.hostname:
            return
        from billiard.process import current_process

        self.host_or_stop(child=current_process().name != "MainProcess")

    def _on_ready(self, sender: Any = None, **_: Any) -> None:
        """Clear a stale shutdown flag; host the crawlers here unless the pool forks."""
        worker = getattr(sender, "controller", sender)  # the signal is sent by the consumer
        if worker is not self.worker:
            return
        project = self.project
        project.client.delete(stopping_worker(project.prefix, self.hostname))
        if not is_prefork(self.worker):
            self.host_or_stop(child=False)

    def _on_shutting_down(self, sender: Any = None, **_: Any) -> None:
        """Tell this worker's job trackers to hand their tasks back (warm shutdown)."""
        if str(sender) != self.hostname:
            return
        project = self.project
        try:
            project.client.set(stopping_worker(project.prefix, self.hostname), 1, ex=600)
        except Exception:
            logger.warning("could not flag the warm shutdown in Redis", exc_info=True)

    def _on_process_shutdown(self, **_: Any) -> None:
        self.stop_hosting()

    def _on_shutdown(self, sender: Any = None, **_: Any) -> None:
        if sender is self.worker:
            self.stop_hosting()

    def host_or_stop(self, child: bool) -> None:
        """Host the crawlers; if they cannot open, stop the whole worker instead of idling on.

        A worker without its crawlers would take job tasks and crawl nothing.
        The solo and threads pools exit with ``EX_CONFIG`` (78). A prefork child
        asks its parent for a warm shutdown and exits, so that the pool does not
        respawn children that fail the same way; the parent exits 0, or 1 when it
        finds first that its pool could not start. An unreachable or full Redis is
        waited for (:meth:`open_patiently`); a configuration error stops it at once.
        """
        try:
            self.open_patiently()
        except Exception as exc:
            logger.critical("the crawlers could not open, so this worker stops: %s", exc)
            if child:
                os.kill(os.getppid(), signal.SIGTERM)
            raise SystemExit(os.EX_CONFIG) from exc

    def open_patiently(self) -> None:
        """Open the crawlers once Redis answers and takes writes; raise what stopped them
        after ``CELERY_CRAWL_OPEN_REDIS_WAIT_SECONDS`` (a worker started before its Redis,
        or while it is out of memory, or a child forked while Redis restarts).

        Redis going away while the crawlers open (after it answered) closes those
        that opened, and all are opened again. One WARNING per try; any other error
        is raised at once.
        """
        project = self.project
        patience = setting(project.settings, "CELERY_CRAWL_OPEN_REDIS_WAIT_SECONDS")
        deadline = time.monotonic() + patience
        for attempt in itertools.count(1):
            try:
                connection.check(project.client)
                check_room(project.client, stopping_worker(project.prefix, self.hostname))
                self.start_hosting()
                return
            except Exception as exc:
                left = deadline - time.monotonic()
                if left <= 0 or not redis_outage(exc):
                    raise
                logger.warning(
                    "the crawlers could not open yet (try %d, %.0f s left of %g s): %s",
                    attempt,
                    left,
                    patience,
                    exc,
                )
                self.stop_hosting(timeout=max(min(left, OPEN_RETRY_MOST), 1.0))  # all open again
                delay = min(OPEN_RETRY_FIRST * 2 ** (attempt - 1), OPEN_RETRY_MOST)
                time.sleep(min(delay, left))

    def start_hosting(self) -> None:
        if self.host is not None:
            return
        spiders = hosted_spiders(self.app, self.project)
        if not spiders:
            logger.warning("this worker's queues serve no spider: hosting no crawlers")
            return
        logcontext.install()  # the crawlers' lines name their spider and job
        self.host = CrawlerHost(self.project.settings, spiders, self.hostname)
        self.host.start()

    def stop_hosting(self, timeout: float = HOSTING_STOP_SECONDS) -> None:
        if self.host is not None:
            self.host.stop(timeout)
            self.host = None


def redis_outage(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps: Twisted's ``FirstError``, a ``Failure``, a
    cause) is Redis away or out of memory, not a configuration error."""
    seen: BaseException | None = error
    for _ in range(10):  # bounded: a chain of causes is short
        if seen is None:
            return False
        if isinstance(seen, (RedisUnavailable, *connection.AWAY_OR_FULL)):
            return True
        sub = getattr(seen, "subFailure", None)  # twisted.internet.defer.FirstError
        context = None if seen.__suppress_context__ else seen.__context__
        seen = sub.value if sub is not None else (seen.__cause__ or context)
    return False


def is_prefork(worker: Any) -> bool:
    return "prefork" in getattr(worker.pool_cls, "__module__", str(worker.pool_cls))


def hosted_spiders(app: Any, project: Project) -> list[str]:
    """``CELERY_CRAWL_SPIDERS`` (default: all), less those whose queue this worker skips."""
    spiders = project.hosted_spiders()
    queues = project.celery_queues()
    if not queues:
        return spiders
    consumed = set(app.amqp.queues.consume_from)
    default = app.conf.task_default_queue
    return [s for s in spiders if queues.get(s, default) in consumed]


# -- revoke ------------------------------------------------------------------

# Celery keeps one registry of remote-control commands per process. The
# wrapper is installed only by a celery_crawl worker's bootstep, and acts only
# for the apps listed here: any other app's revoke is Celery's own.
_cooperative_apps: set[int] = set()
_builtin_revoke: list[Any] = []


def install_cooperative_revoke(app: Any) -> None:
    from celery.worker.control import Panel

    _cooperative_apps.add(id(app))
    if Panel.data["revoke"] is not cooperative_revoke:
        _builtin_revoke[:] = [Panel.data["revoke"]]
        Panel.data["revoke"] = cooperative_revoke


def cooperative_revoke(state: Any, task_id: Any, terminate: bool = False, **kwargs: Any) -> Any:
    """``revoke`` for job tasks: cancel the job in Redis; never kill a process.

    A job task is not revoked in Celery's sense: one that no worker has taken yet still
    runs when taken, and returns its cancelled job as a running one does (Celery's own
    revoke would drop it on receipt, and its result would be ``TaskRevokedError``).
    Other tasks get Celery's own revoke."""
    from celery.utils.functional import maybe_list

    builtin = _builtin_revoke[0]
    if id(state.app) not in _cooperative_apps:
        return builtin(state, task_id, terminate=terminate, **kwargs)
    ids = list(maybe_list(task_id) or [])
    jobs = [job for job in (find_job(state.app, i) for i in ids) if job is not None]
    for job in jobs:
        purged = job.cancel()
        logger.info("job %s cancelled by revoke; %d queued requests purged", job.id, purged)
    others = [i for i in ids if i not in {job.id for job in jobs}]
    if others:
        builtin(state, others, terminate=terminate, **kwargs)
    return {"ok": f"jobs cancelled: {[j.id for j in jobs]}; tasks revoked: {others}"}


def check_room(client: redis.Redis, flag: str) -> None:
    """A write that changes nothing, refused while Redis is out of memory
    (``queue/lua/include/room.lua``). ``flag`` is this worker's own shutdown flag, stale
    at start (``_on_ready`` deletes it): one of another type (damaged) is deleted, with an
    ERROR, and never stops the worker."""
    try:
        client.setrange(flag, 0, "")
    except redis.ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise
        logger.error("key %s had the wrong type: deleted (a stale shutdown flag)", flag)
        client.delete(flag)
        client.setrange(flag, 0, "")
