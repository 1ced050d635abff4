"""Application code's side: start a crawl job, or find one, from any process.

This module needs a Celery app made by :func:`celery_crawl.create_app`, but
does not change it: importing it, or calling :func:`crawl`, connects no
signal and patches nothing. Workers are wired by the app's bootstep
(:mod:`celery_crawl.app.worker`).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from celery_crawl.core import connection
from celery_crawl.core.keys import job_spider
from celery_crawl.hosting.project import Project, project_of
from celery_crawl.jobs.handle import Job
from celery_crawl.jobs.inputs import JobInput, check_job
from celery_crawl.jobs.limits import check_limits, limit_fields
from celery_crawl.jobs.store import ARGS_FIELD
from celery_crawl.producer.schedule import Schedule

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from celery_crawl.core.keys import SpiderKeys

logger = logging.getLogger(__name__)
JOB_TASK = "celery_crawl.crawl"
PRODUCE_TASK = "celery_crawl.produce"
JOB_INDEX_TTL = 30 * 24 * 3600  # a job not yet finished; its tracker renews it, its end shortens it
# The message priority of a job task. kombu's Redis transport keeps a queue's messages
# in one list per priority step (0, 3, 6, 9) and takes from them in that order, 0
# (every message without a priority) first: a tick that starts a hundred jobs queues
# their messages behind beat's next tick, and behind any other task, not ahead of them.
JOB_MESSAGE_PRIORITY = 6


def crawl(
    spider: str,
    seeds: Sequence[Any] = (),
    priority: int = 0,
    *,
    app: Any = None,
    job_id: str | None = None,
    limits: dict[str, float] | None = None,
    args: dict[str, str] | None = None,
    source: str | None = None,
) -> Job:
    """Start a crawl job; returns at once with a handle (``wait``, ``status``, ``cancel``).

    With no ``seeds``, the job crawls what the spider's ``start()`` yields (its
    ``start_urls``): hosted spiders run their start requests only that way.

    Unknown spiders, spiders that no worker may host (``CELERY_CRAWL_SPIDERS``),
    bad seeds and an unreachable Redis raise here, in the caller's process. A
    spider that no live worker hosts yet is accepted: its job waits, and says
    so in its progress. The job is also a Celery task whose id is the job id.

    ``args`` are the job's spider arguments, as ``scrapy crawl -a NAME=VALUE``
    gives them: attributes of the spider that makes the seed requests, and
    ``celery_crawl.job_args(response)`` in every callback of the job.

    ``limits`` are the job's own, by name, each with the meaning of the Scrapy
    setting that gives the spider's default (``pages`` is ``CLOSESPIDER_PAGECOUNT``,
    ``depth`` is ``DEPTH_LIMIT``, and so on: :data:`celery_crawl.jobs.limits.LIMITS`
    is the table, and ``celery-crawl crawl --help`` lists it). A limit reached ends
    the job ``closed`` with Scrapy's reason, but ``depth``: deeper requests are not
    followed. 0 lifts the spider's own limit.

    ``source`` names what the job crawls again and again (a source of the producer's
    schedule sets its own): a hit-expiring filter (``HitExpiringDupeFilter``) counts
    the crawls of each source apart.

    Input that breaks the rules of :mod:`celery_crawl.jobs.inputs` (job id, seeds,
    priority, limits, arguments) raises :class:`~celery_crawl.core.errors.BadInput`
    before anything is written.
    """
    from celery import current_app

    job_id = uuid.uuid4().hex if job_id is None else job_id
    given = check_job(
        spider, seeds, priority=priority, job_id=job_id, limits=limits, args=args, source=source
    )
    app = app or current_app
    project = project_of(app)
    project.check_hostable(spider)
    # the one crawler of this crawl: settings, seed requests
    return start_crawl(app, project, project.crawler(spider), given)


def start_crawl(app: Any, project: Project, crawler: Crawler, given: JobInput) -> Job:
    """:func:`crawl` once its input is checked, with ``crawler`` (its spider's), which a
    caller that starts many jobs of one spider builds once (the producer's tick)."""
    limits = check_limits(project.job_limits(crawler, given.limits))  # the settings' too
    spider, seeds, args, priority = given.spider, given.seeds, given.args, given.priority
    job, _ = start_job(
        project,
        spider,
        seeds,
        priority,
        given.job_id,
        limits=limits,
        args=args,
        crawler=crawler,
        source=given.source,
        scheduled=(given.due_at, given.reserved_at),
    )
    job.app = app
    # the source is in the job's hash already: a worker of an older version, which takes
    # no such argument, still runs the task
    kwargs = {"priority": priority, "limits": limits, "args": args}
    app.send_task(
        JOB_TASK,
        args=(spider, seeds),
        kwargs=kwargs,
        task_id=job.id,
        priority=JOB_MESSAGE_PRIORITY,
    )
    return job


def start_job(
    project: Project,
    spider: str,
    seeds: Sequence[Any],
    priority: int,
    job_id: str,
    *,
    limits: dict[str, float] | None = None,
    args: dict[str, str] | None = None,
    crawler: Crawler | None = None,
    source: str = "",
    scheduled: tuple[float, float] = (0.0, 0.0),
) -> tuple[Job, bool]:
    """Create the job and enqueue its seeds; a job that exists already is left as it is.

    ``crawler`` is the spider's crawler if the caller made one already
    (:meth:`~celery_crawl.hosting.project.Project.crawler`); else one is made here.
    ``source`` and ``scheduled`` (its due and reservation times, unix s) are the
    schedule's, for a job a tick started (:class:`~celery_crawl.jobs.handle.JobStatus`).

    A full Redis refuses a new job (``OutOfMemoryError``, raised). Redis checks
    memory as a script starts, so the job may be created and only its index entry
    refused: the job exists, and the job task writes the entry at its next report
    (:func:`celery_crawl.app.tasks.write_index`), so the start goes on without it.
    """
    crawler = crawler if crawler is not None else project.crawler(spider)
    queue = project.queue(crawler)
    entries = project.seed_entries(crawler, seeds, job_id, priority, args or {}, queue=queue)
    fields = {"spider": spider, "seeds": json.dumps(seeds, separators=(",", ":"))}
    fields["keep"] = str(int(project.job_keep(crawler)))
    fields.update(limit_fields(limits or {}))
    if args:
        fields[ARGS_FIELD] = json.dumps(args, separators=(",", ":"))
    if source:
        fields["source"] = source
    if scheduled[1]:
        fields["due_at"], fields["reserved_at"] = (f"{at:.3f}" for at in scheduled)
    with connection.reachable(queue.client):
        fields["priority"] = str(priority)
        spans = project.job_spans(crawler)
        created, _ = queue.start_job(job_id, entries, fields, spans)
        try:
            queue.client.set(job_spider(project.prefix, job_id), spider, ex=JOB_INDEX_TTL)
        except connection.OUT_OF_MEMORY:
            logger.warning("job %s: its index entry not written yet: Redis is full", job_id)
    return job_handle(project, crawler, job_id, spans), created


def job_handle(
    project: Project, crawler: Crawler, job_id: str, spans: list[SpiderKeys] | None = None
) -> Job:
    """The handle on job ``job_id`` of ``crawler``'s spider; nothing is read or written.
    ``spans``: the spider's group, when the caller has it already."""
    queue = project.queue(crawler)
    spans = spans if spans is not None else project.job_spans(crawler)
    return Job(job_id, crawler.spidercls.name, queue.client, queue.keys, spans, dedup=queue.dedup)


def sources(spider: str, *, app: Any = None) -> Schedule:
    """``spider``'s sources on their own schedules, to add, change, pause, resume and
    remove them at run time (:mod:`celery_crawl.producer.schedule`)."""
    from celery import current_app

    project = project_of(app or current_app)
    project.check_hostable(spider)
    return project.schedule(spider)


def find_job(app: Any, job_id: str) -> Job | None:
    """The job with this id, found through the job index; None if unknown."""
    project = project_of(app)
    spider = project.client.get(job_spider(project.prefix, job_id))
    if spider is None:
        return None
    name = spider.decode()
    components = project.components(name)
    keys, spans, dedup = components.keys(name), components.group(name), components.dedup
    return Job(job_id, name, project.client, keys, spans, app=app, dedup=dedup)
