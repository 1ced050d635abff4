"""The Celery app factory.

``create_app("tasks", "tasks.settings")`` gives a Celery app that:

- uses ``REDIS_URL`` as broker and result backend unless configured otherwise
  (a cluster or sentinel URL needs an explicit broker, see
  :func:`transport_conf`), with the JSON serializer only;
- registers the job task ``celery_crawl.crawl`` and the producer task
  ``celery_crawl.produce`` (:mod:`celery_crawl.app.tasks`), routed to each
  spider's Celery queue (``CELERY_CRAWL_QUEUES``), and a beat entry per
  ``PRODUCER_SPIDERS``;
- adds the :class:`~celery_crawl.app.worker.CrawlerHosting` bootstep to its
  workers, which hosts the crawlers and makes ``revoke`` cooperative, and the
  :class:`~celery_crawl.app.trackers.JobTrackers` bootstep, which runs job tasks
  beside the pool, so that a job holds no pool slot from other work.

Creating an app changes nothing outside it: no signal is connected and no
Celery internals are patched until one of its workers is built.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from celery import Celery

from celery_crawl.app.client import JOB_TASK, PRODUCE_TASK
from celery_crawl.app.tasks import run_job, run_producer
from celery_crawl.app.trackers import JobTrackers
from celery_crawl.app.worker import CrawlerHosting
from celery_crawl.core import connection
from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.hosting.project import Project


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
        result_expires=setting(project.settings, "CELERY_CRAWL_JOB_KEEP_SECONDS"),
        broker_connection_retry_on_startup=True,
        celery_crawl_settings=scrapy_settings,
    )
    app.conf.update(conf)
    route_by_spider(app, project)
    # STARTED is stored by run_job, which lets a full or restarting Redis refuse it:
    # stored by Celery's tracing, a refusal failed the task before run_job ran
    app.task(bind=True, name=JOB_TASK, acks_late=True, track_started=False, shared=False)(run_job)
    app.task(bind=True, name=PRODUCE_TASK, shared=False)(run_producer)
    app.conf.beat_schedule = producer_schedule(project) | dict(app.conf.beat_schedule or {})
    app.steps["worker"].add(CrawlerHosting)
    app.steps["worker"].add(JobTrackers)
    # kept out of app.conf: `celery inspect conf` (which Flower shows) would list a REDIS_URL
    # given here with its password; Celery masks only the keys it knows to be secret
    app.celery_crawl_overrides = dict(settings or {})
    app.celery_crawl_project = project
    return app


def producer_schedule(project: Project) -> dict[str, Any]:
    """A beat entry per ``PRODUCER_SPIDERS``, every ``PRODUCER_PERIOD`` seconds."""
    return {
        f"produce-{spider}": {
            "task": PRODUCE_TASK,
            "schedule": setting(project.settings, "PRODUCER_PERIOD"),
            "args": (spider,),
        }
        for spider in setting(project.settings, "PRODUCER_SPIDERS")
    }


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


def route_by_spider(app: Celery, project: Project) -> None:
    """Send each spider's job and producer tasks to its Celery queue.

    A worker started with ``-Q forum.list`` then hosts only the spiders of that
    queue; a worker without ``-Q`` consumes every queue and hosts every spider.
    """
    queues = project.celery_queues()
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
        if name in (JOB_TASK, PRODUCE_TASK) and spider in queues:
            return {"queue": queues[spider]}
        return None

    app.conf.task_routes = [route, *list(app.conf.task_routes or [])]
