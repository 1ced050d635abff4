"""Celery integration: the app factory, the job task, and worker hosting.

``create_app("tasks", "tasks.settings")`` gives a Celery app that:

- uses ``REDIS_URL`` as broker and result backend unless configured otherwise
  (a cluster or sentinel URL needs an explicit broker, see
  :func:`transport_conf`), with the JSON serializer only;
- hosts the project's crawlers in every worker process (see
  :mod:`celery_crawl.hosting`), set up after the fork for prefork;
- registers the task ``celery_crawl.crawl``: it creates the job if it does not
  exist yet (idempotent by job id), then reports its progress until it is
  done and returns its statistics. The task id is the job id.

``revoke`` of a job task (from Flower or ``AsyncResult.revoke``) cancels the
job cooperatively; it never terminates a worker process.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Sequence
from typing import Any

from celery import Celery, Task, signals
from celery.exceptions import Reject

from celery_crawl import connection
from celery_crawl.errors import ConfigError
from celery_crawl.hosting import CrawlerHost
from celery_crawl.jobs import Job, JobFailed, JobTimeout
from celery_crawl.keys import DEFAULT_PREFIX, job_spider, stopping_worker
from celery_crawl.project import Project

logger = logging.getLogger(__name__)

TASK_NAME = "celery_crawl.crawl"
PRODUCE_TASK = "celery_crawl.produce"
JOB_INDEX_TTL = 30 * 24 * 3600  # longer than any job, plus the week a finished one is kept


class _ProcessState:
    """What this worker process hosts, and the revoke command we wrap."""

    host: CrawlerHost | None = None
    builtin_revoke: Any = None


_process = _ProcessState()


def create_app(
    main: str,
    scrapy_settings: str | None = None,
    *,
    settings: dict[str, Any] | None = None,
    **conf: Any,
) -> Celery:
    """A Celery app hosting the crawlers of the Scrapy project ``scrapy_settings``.

    ``settings`` overlays the Scrapy settings module; ``conf`` is Celery
    configuration (``broker_url`` and ``result_backend`` default to ``REDIS_URL``).
    """
    project = Project.from_module(scrapy_settings, settings)
    transport = transport_conf(connection.url_from_settings(project.settings), conf)
    app = Celery(main, broker=transport["broker_url"], backend=transport["result_backend"])
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_track_started=True,
        result_extended=True,
        broker_connection_retry_on_startup=True,
        celery_crawl_settings=scrapy_settings,
        celery_crawl_overrides=settings or {},
    )
    app.conf.update(conf)
    route_by_spider(app, project)
    app.task(bind=True, name=TASK_NAME, acks_late=True)(run_job)
    app.task(bind=True, name=PRODUCE_TASK)(run_producer)
    app.conf.beat_schedule = {
        f"produce-{spider}": {
            "task": PRODUCE_TASK,
            "schedule": project.settings.getfloat("PRODUCER_PERIOD", 60.0),
            "args": (spider,),
        }
        for spider in project.settings.getlist("PRODUCER_SPIDERS")
    } | dict(app.conf.beat_schedule or {})
    app.celery_crawl_project = project
    return app


def transport_conf(url: str, conf: dict[str, Any]) -> dict[str, Any]:
    """Celery's broker and result backend: ``conf``'s, else ``REDIS_URL`` when it is one server.

    Kombu has no Redis Cluster transport, and its ``sentinel://`` transport
    stops the worker when the master dies (kombu 5.7): with a cluster or a
    sentinel ``REDIS_URL``, ``broker_url`` (or ``CELERY_BROKER_URL``) must be
    given, and its server also keeps the results unless ``result_backend`` says
    otherwise. The crawl state never goes through the broker.
    """
    broker = conf.get("broker_url") or os.environ.get("CELERY_BROKER_URL")
    backend = conf.get("result_backend") or os.environ.get("CELERY_RESULT_BACKEND")
    if not (connection.is_cluster_url(url) or connection.is_sentinel_url(url)):
        return {"broker_url": broker or url, "result_backend": backend or url}
    if not broker:
        raise ConfigError(
            f"REDIS_URL {connection.redact(url)!r} is a Redis Cluster or Sentinel set, which "
            "Celery's broker cannot use: set broker_url (or CELERY_BROKER_URL) to a plain Redis"
        )
    return {"broker_url": broker, "result_backend": backend or broker}


def spider_queues(project: Project) -> dict[str, str]:
    """``CELERY_CRAWL_QUEUES``: the Celery queue of each spider (others use the default)."""
    return {str(k): str(v) for k, v in project.settings.getdict("CELERY_CRAWL_QUEUES").items()}


def route_by_spider(app: Celery, project: Project) -> None:
    """Send each spider's job and producer tasks to its Celery queue.

    A worker started with ``-Q forum.list`` then hosts only the spiders of that
    queue; a worker without ``-Q`` consumes every queue and hosts every spider.
    """
    queues = spider_queues(project)
    if not queues:
        return
    from kombu.entity import Exchange, Queue

    names = dict.fromkeys([app.conf.task_default_queue, *queues.values()])
    if not app.conf.task_queues:  # what Celery would create for a missing queue
        app.conf.task_queues = [
            Queue(n, Exchange(n), routing_key=n)  # type: ignore[no-untyped-call]
            for n in names
        ]

    def route(name: str, args: Sequence[Any], kwargs: dict[str, Any], *_: Any, **__: Any) -> Any:
        spider = args[0] if args else kwargs.get("spider")
        if name in (TASK_NAME, PRODUCE_TASK) and spider in queues:
            return {"queue": queues[spider]}
        return None

    app.conf.task_routes = [route, *list(app.conf.task_routes or [])]


def project_of(app: Celery) -> Project:
    """The app's Scrapy project, loaded once per app."""
    project = getattr(app, "celery_crawl_project", None)
    if project is None:
        conf = app.conf
        project = Project.from_module(
            conf.get("celery_crawl_settings"), conf.get("celery_crawl_overrides")
        )
        app.celery_crawl_project = project
    return project


def prefix_of(project: Project) -> str:
    return str(project.settings.get("CELERY_CRAWL_KEY_PREFIX") or DEFAULT_PREFIX)


# -- the job: start it, or join it ------------------------------------------


def start_job(
    project: Project, spider: str, seeds: Sequence[Any], priority: int, job_id: str
) -> tuple[Job, bool]:
    """Create the job and enqueue its seeds; an existing job id is joined."""
    entries = project.seed_entries(spider, seeds, job_id, priority)
    queue = project.queue(spider)
    fields = {"spider": spider, "seeds": json.dumps(seeds, separators=(",", ":"))}
    with connection.reachable(queue.client):
        created, _ = queue.start_job(job_id, entries, {**fields, "priority": str(priority)})
        queue.client.set(job_spider(prefix_of(project), job_id), spider, ex=JOB_INDEX_TTL)
    return Job(job_id, spider, queue.client, queue.keys, project.job_queues(spider)), created


def run_job(task: Task, spider: str, seeds: list[Any], priority: int = 0) -> dict[str, Any]:
    """The body of ``celery_crawl.crawl``: start or join the job, report, return stats."""
    project = project_of(task.app)
    job, created = start_job(project, spider, seeds, priority, task.request.id)
    logger.info(
        "job %s %s: spider=%s seeds=%s", job.id, "started" if created else "joined", spider, seeds
    )
    interval = project.settings.getfloat("CELERY_CRAWL_PROGRESS_INTERVAL", 1.0)
    stopping = stopping_worker(prefix_of(project), task.request.hostname or "")
    while True:
        try:
            result = job.wait(timeout=interval)
        except connection.TRANSIENT_ERRORS as exc:  # Redis restarting: keep watching
            logger.warning("job %s: Redis unreachable (%s); still watching", job.id, exc)
            time.sleep(interval)
            continue
        except JobTimeout:
            report_progress(task, job)
            job.client.expire(job_spider(prefix_of(project), job.id), JOB_INDEX_TTL)
            if job.client.exists(stopping):
                raise Reject("worker shutting down; another worker joins the job", requeue=True)  # noqa: B904
            continue
        logger.info(
            "job %s finished: spider=%s seeds=%s state=%s pages=%s items=%s errors=%s duration=%ss",
            job.id,
            spider,
            seeds,
            result["state"],
            result["pages"],
            result["items"],
            sum(result["errors"].values()),
            result["duration"],
        )
        if result["state"] == "failed":
            raise JobFailed(f"job {job.id} fetched no page: errors {result['errors']}")
        return result


def run_producer(task: Task, spider: str) -> dict[str, Any]:
    """The body of ``celery_crawl.produce``: one backpressure-aware tick (see producer)."""
    from celery_crawl.producer import Producer
    from celery_crawl.project import parse_seed

    project = project_of(task.app)
    settings = project.settings
    spidercls = project.spider_class(spider)
    producer = Producer(
        project.client,
        project.keys(spider),
        job_cap=settings.getint("PRODUCER_JOB_CAP", 10),
        queue_cap=settings.getint("PRODUCER_QUEUE_CAP", 100_000),
    )

    def start(source: str, job_id: str) -> None:
        crawl(spider, [parse_seed(spidercls, source)], app=task.app, job_id=job_id)

    tick = producer.tick(producer.sources(settings.getlist("PRODUCER_SOURCES")), start)
    return {"produced": dict(tick.produced), "sources": tick.sources, "queued": tick.queued}


def report_progress(task: Task, job: Job) -> None:
    progress = job.status().as_dict()
    task.update_state(state="PROGRESS", meta=progress)
    try:
        task.send_event("task-progress", progress=progress)
    except Exception:  # monitoring only: never fail the job over an event
        logger.debug("progress event not sent", exc_info=True)


# -- application code's entry point ----------------------------------------


def crawl(
    spider: str,
    seeds: Sequence[Any],
    priority: int = 0,
    *,
    app: Celery | None = None,
    job_id: str | None = None,
) -> Job:
    """Start a crawl job; returns at once with a handle (``wait``, ``status``, ``cancel``).

    Unknown spiders, bad seeds and an unreachable Redis raise here, in the
    caller's process. The job is also a Celery task whose id is the job id.
    """
    from celery import current_app

    app = app or current_app
    job, _ = start_job(project_of(app), spider, list(seeds), priority, job_id or uuid.uuid4().hex)
    job.result = app.send_task(  # type: ignore[attr-defined]
        TASK_NAME, args=(spider, list(seeds)), kwargs={"priority": priority}, task_id=job.id
    )
    return job


def find_job(app: Celery, job_id: str) -> Job | None:
    """The job with this id, found through the job index; None if unknown."""
    project = project_of(app)
    spider = project.client.get(job_spider(prefix_of(project), job_id))
    if spider is None:
        return None
    name = spider.decode()
    return Job(job_id, name, project.client, project.keys(name), project.job_queues(name))


# -- worker hosting --------------------------------------------------------


def hosted_spiders(app: Celery, project: Project) -> list[str]:
    """``CELERY_CRAWL_SPIDERS`` (default: all), less those whose queue this worker skips."""
    spiders = project.settings.getlist("CELERY_CRAWL_SPIDERS") or project.spider_names()
    queues = spider_queues(project)
    if not queues:
        return spiders
    consumed = set(app.amqp.queues.consume_from)
    default = app.conf.task_default_queue
    return [s for s in spiders if queues.get(s, default) in consumed]


def start_hosting(app: Celery) -> None:
    if _process.host is not None:
        return
    project = project_of(app)
    spiders = hosted_spiders(app, project)
    if not spiders:
        logger.warning("this worker's queues serve no spider: hosting no crawlers")
        return
    _process.host = CrawlerHost(project.settings, spiders)
    _process.host.start()


def stop_hosting() -> None:
    if _process.host is not None:
        _process.host.stop()
        _process.host = None


def _is_prefork(worker: Any) -> bool:
    return "prefork" in getattr(worker.pool_cls, "__module__", str(worker.pool_cls))


def host_or_stop(app: Celery, child: bool) -> None:
    """Host the crawlers; if they cannot open, stop the whole worker instead of idling on.

    A worker without its crawlers would take job tasks and crawl nothing.
    The solo and threads pools exit with ``EX_CONFIG`` (78). A prefork child
    asks its parent for a warm shutdown and exits, so that the pool does not
    respawn children that fail the same way; the parent exits 0, or 1 when it
    finds first that its pool could not start.
    """
    try:
        start_hosting(app)
    except Exception as exc:
        logger.critical("the crawlers could not open, so this worker stops: %s", exc)
        if child:
            os.kill(os.getppid(), signal.SIGTERM)
        raise SystemExit(os.EX_CONFIG) from exc


def _on_child_init(**_: Any) -> None:
    """``worker_process_init``: in each prefork child, and once in the solo pool's process."""
    from billiard.process import current_process
    from celery import current_app

    host_or_stop(current_app, child=current_process().name != "MainProcess")


def _on_child_shutdown(**_: Any) -> None:
    stop_hosting()


def _on_worker_shutdown(**_: Any) -> None:
    stop_hosting()


def _on_shutting_down(sender: Any = None, **_: Any) -> None:
    """Tell this worker's job trackers to hand their tasks back (warm shutdown)."""
    from celery import current_app

    project = project_of(current_app)
    key = stopping_worker(prefix_of(project), str(sender))
    try:
        project.client.set(key, 1, ex=600)
    except Exception:
        logger.warning("could not flag the warm shutdown in Redis", exc_info=True)


def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Clear a stale shutdown flag; host the crawlers here unless the pool forks.

    Prefork children set up their own reactor after the fork
    (``worker_process_init``); the solo and threads pools run tasks in this
    process, so the crawlers live here, started once logging is configured.
    """
    worker = getattr(sender, "controller", sender)  # the signal is sent by the consumer
    project = project_of(worker.app)
    project.client.delete(stopping_worker(prefix_of(project), worker.hostname))
    if not _is_prefork(worker):
        host_or_stop(worker.app, child=False)


def cooperative_revoke(state: Any, task_id: Any, terminate: bool = False, **kwargs: Any) -> Any:
    """``revoke`` for job tasks: cancel the job in Redis; never kill a process."""
    from celery.utils.functional import maybe_list

    ids = list(maybe_list(task_id) or [])
    jobs = [job for job in (find_job(state.app, i) for i in ids) if job is not None]
    for job in jobs:
        purged = job.cancel()
        logger.info("job %s cancelled by revoke; %d queued requests purged", job.id, purged)
    others = [i for i in ids if i not in {job.id for job in jobs}]
    _process.builtin_revoke(state, ids, terminate=terminate and not jobs and bool(others), **kwargs)
    return {"ok": f"jobs cancelled: {[j.id for j in jobs]}; tasks revoked: {others}"}


def install_cooperative_revoke() -> None:
    from celery.worker.control import Panel

    if Panel.data["revoke"] is not cooperative_revoke:
        _process.builtin_revoke = Panel.data["revoke"]
        Panel.data["revoke"] = cooperative_revoke


def connect_signals() -> None:
    signals.worker_process_init.connect(_on_child_init, weak=False)
    signals.worker_process_shutdown.connect(_on_child_shutdown, weak=False)
    signals.worker_shutdown.connect(_on_worker_shutdown, weak=False)
    signals.worker_shutting_down.connect(_on_shutting_down, weak=False)
    signals.worker_ready.connect(_on_worker_ready, weak=False)


install_cooperative_revoke()
connect_signals()
