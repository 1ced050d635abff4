"""The bodies of the two Celery tasks that ``create_app`` registers.

- ``celery_crawl.crawl`` (:func:`run_job`): start the job if it does not
  exist yet (idempotent by job id, the task id), then report its progress
  until it is done and return its statistics. The crawling itself is done by
  the crawlers every worker process hosts; this task only seeds and watches.
- ``celery_crawl.produce`` (:func:`run_producer`): one backpressure-aware
  producer tick, run by beat.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import redis
from celery import Task, states
from celery.exceptions import Reject

from celery_crawl.app.client import JOB_INDEX_TTL, job_handle, start_crawl, start_job
from celery_crawl.app.trackers import pause, shutting_down
from celery_crawl.core import connection
from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import (
    BadInput,
    ConfigError,
    JobFailed,
    JobIncomplete,
    JobTimeout,
    RedisOutOfMemory,
    quote,
)
from celery_crawl.core.keys import job_spider, stopping_worker
from celery_crawl.hosting.project import Project, parse_seed, project_of
from celery_crawl.hosting.registry import Registry, WorkerInfo, waiting_reason
from celery_crawl.jobs.handle import Job, JobStatus
from celery_crawl.jobs.inputs import JOB_ID, JobInput, check_args, check_job, check_seeds
from celery_crawl.jobs.limits import check_limits, time_limited
from celery_crawl.producer import sources_file
from celery_crawl.producer.schedule import Reserved, Schedule

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)
HAND_BACK = "worker shutting down; another worker joins the job"
# how long a job task waits for room in a full Redis to start a job without a seconds limit
START_WAIT_SECONDS = 3600.0


def run_job(
    task: Task,
    spider: str,
    seeds: list[Any],
    *,
    priority: int = 0,
    limits: dict[str, float] | None = None,
    args: dict[str, str] | None = None,
    source: str = "",
) -> dict[str, Any]:
    """The body of ``celery_crawl.crawl``: start the job (or find it started), watch it,
    report, return stats.

    Its arguments come from a message, which anyone may send: they are checked
    as ``crawl()`` checks them (:mod:`celery_crawl.jobs.inputs`) before anything is written.
    """
    given = check_job(
        spider,
        seeds,
        priority=priority,
        job_id=task.request.id,
        limits=limits,
        args=args,
        source=source,
    )
    project = project_of(task.app)
    hostname = task.request.hostname or ""
    store_started(task)
    job, created = start_when_room(task, project, given)
    logger.info(
        "job %s %s: spider=%s seeds=%s",
        job.id,
        "started" if created else "joined",
        spider,
        quote(given.seeds),
    )
    interval = setting(project.settings, "CELERY_CRAWL_PROGRESS_INTERVAL")
    stopping = stopping_worker(project.prefix, hostname)
    index = job_spider(project.prefix, job.id)
    registry, waiting = Registry.from_settings(project.settings), ""
    while True:
        hand_back_if_stopping(hostname)  # in the process: needs no Redis
        try:
            try:
                result = job.wait(timeout=interval)
            except JobTimeout as exc:  # running still: its progress, then watched again
                waiting, told_to_stop = at_interval(
                    task, job, registry, waiting, timeout=exc, keys=(index, stopping)
                )
                if told_to_stop:  # the flag in Redis, for a task run elsewhere
                    raise Reject(HAND_BACK, requeue=True)  # noqa: B904
                continue
        except connection.TRANSIENT_ERRORS as exc:  # Redis restarting: keep watching
            connection.warn_away(
                logger, "job %s: Redis unreachable (%s); still watching", job.id, exc
            )
            pause(hostname, interval)
            continue
        # the job's index entry now lives as long as its hash (CELERY_CRAWL_JOB_KEEP_SECONDS)
        write_index(job, index, int(project.job_keep(spider)))
        return finished(job, result)


def at_interval(
    task: Task,
    job: Job,
    registry: Registry,
    waiting: str,
    *,
    timeout: Exception,
    keys: tuple[str, str],
) -> tuple[str, bool]:
    """A progress interval of a running job: its progress reported, its ``seconds`` limit
    applied, its index entry renewed; what it waits for now, and whether the flag of a
    stopping worker is set. ``keys``: the job's index entry and that flag. May raise a
    transient Redis error."""
    index, stopping = keys
    status = job.status()
    now_waiting = report_progress(task, status, registry.read(job.client), timeout)
    if now_waiting != waiting:  # logged when it starts, and when it ends
        logger.warning("job %s: %s", job.id, now_waiting or "a live worker hosts it now")
    end_if_out_of_time(job, status)
    write_index(job, index, JOB_INDEX_TTL)
    return now_waiting, bool(job.client.exists(stopping))


def write_index(job: Job, key: str, seconds: int) -> None:
    """The job's index entry (job id to spider, :func:`celery_crawl.app.client.find_job`), for
    ``seconds``: written whole, so an entry that a full Redis refused at the start is
    written now. Still full, its time is only extended (``EXPIRE`` takes no memory).
    Redis away (restarting just as the job ended): the entry keeps the time it had, and
    the task still returns the job's end."""
    try:
        try:
            job.client.set(key, job.spider, ex=seconds)
        except connection.OUT_OF_MEMORY:
            job.client.expire(key, seconds)
    except connection.TRANSIENT_ERRORS as exc:
        connection.warn_away(
            logger, "job %s: its index entry not renewed, Redis unreachable (%s)", job.id, exc
        )


def hand_back_if_stopping(hostname: str) -> None:
    """Give the task back to the broker if its worker is in a warm shutdown."""
    if shutting_down(hostname):
        raise Reject(HAND_BACK, requeue=True)


def store_started(task: Task) -> None:
    """The task's ``STARTED`` state, as Celery's ``task_track_started`` stores it.

    The result backend is often the crawl's Redis: full, it refuses the state, and
    away, it cannot take it. The job goes on all the same; only the state is missing.
    """
    if not task.app.conf.task_track_started or task.ignore_result:
        return
    meta = {"pid": os.getpid(), "hostname": task.request.hostname}
    try:
        task.update_state(state=states.STARTED, meta=meta)
    except connection.AWAY_OR_FULL as exc:
        logger.warning("job %s: its STARTED state not stored: %s", task.request.id, exc)


def start_when_room(task: Task, project: Project, given: JobInput) -> tuple[Job, bool]:
    """The job, started by ``crawl()`` already (the producer's jobs too), or else by
    ``start_job`` here (a task sent without ``crawl()``: a beat entry for
    ``celery_crawl.crawl``, or ``send_task``), waiting while Redis is full: it refuses
    a new job's first write.

    It waits up to the job's ``seconds`` limit, or :data:`START_WAIT_SECONDS`
    without one, then raises; a warm shutdown hands the task back meanwhile.
    """
    crawler = project.crawler(given.spider)
    job = job_handle(project, crawler, given.job_id)
    with connection.reachable(job.client):
        if job.exists():  # ``crawl()`` started it before sending this task: nothing to write
            return job, False
    limit = (given.limits or {}).get("seconds") or START_WAIT_SECONDS
    deadline = time.monotonic() + limit
    interval = setting(project.settings, "CELERY_CRAWL_PROGRESS_INTERVAL")
    warned = False
    while True:
        try:
            return start_job(
                project,
                given.spider,
                given.seeds,
                given.priority,
                given.job_id,
                limits=given.limits,
                args=given.args,
                crawler=crawler,
                source=given.source,
            )
        except connection.OUT_OF_MEMORY as exc:
            if time.monotonic() >= deadline:
                raise RedisOutOfMemory(
                    f"job {given.job_id} not started in {limit:.0f} s: Redis is full: {exc}"
                ) from exc
            log = logger.debug if warned else logger.warning
            log("job %s not started yet, Redis is full: %s; trying again", given.job_id, exc)
            warned = True
        hand_back_if_stopping(task.request.hostname or "")
        pause(task.request.hostname or "", interval)


def end_if_out_of_time(job: Job, status: JobStatus) -> None:
    """The ``seconds`` limit, which only the tracker sees: the job ends ``closed``.

    Redis compares the job's age with its limit on its own clock, so a worker
    whose clock is off closes it neither early nor late.
    """
    limit = time_limited(status.limits, status.finished)
    if not limit:
        return
    try:
        closed = job.end_if_out_of_time()
    except redis.ResponseError as exc:  # a damaged key of the job: checked again next report
        logger.warning("job %s: its time limit not checked, Redis refused: %s", job.id, exc)
        return
    if closed:
        logger.info("job %s closed: its time limit of %s s was reached", job.id, limit)


def finished(job: Job, result: dict[str, Any]) -> dict[str, Any]:
    """Log the job's end; a failed or incomplete job raises, so that Flower shows a failure."""
    logger.info(
        "job %s finished: spider=%s seeds=%s state=%s pages=%s items=%s errors=%s dropped=%s"
        " duration=%ss",
        job.id,
        job.spider,
        quote(result["seeds"]),
        result["state"],
        result["pages"],
        result["items"],
        sum(result["errors"].values()),
        result["dropped"],
        result["duration"],
    )
    if result["state"] == "failed":
        raise JobFailed(f"job {job.id} fetched no page: errors {result['errors']}")
    if result["state"] == "incomplete":
        raise JobIncomplete(incomplete_message(job, result, lost_cause(job, result)))
    return result


def lost_cause(job: Job, result: dict[str, Any]) -> str:
    """Why requests of the job were lost from Redis, as far as Redis can tell."""
    return job.evictions() if result["errors"].get("lost") else ""


def incomplete_message(job: Job, result: dict[str, Any], cause: str = "") -> str:
    """What made the job incomplete: requests dropped (not queued), or lost from Redis."""
    kinds = {k[8:]: v for k, v in result["errors"].items() if k.startswith("dropped/")}
    reasons = []
    if result["dropped"]:
        reasons.append(
            f"{result['dropped']} requests could not be queued ({kinds}); they are in the"
            f" dead-letter list {job.keys.deadletter}, with the reason"
        )
    lost = result["errors"].get("lost", 0)
    if lost:
        why = cause or "a key deleted, or writes Redis lost in a crash"
        reasons.append(f"{lost} requests were lost from Redis ({why})")
    return f"job {job.id} ended incomplete: {result['pages']} pages, but " + "; and ".join(
        reasons or ["requests of it were not done"]
    )


def report_progress(
    task: Task, status: JobStatus, workers: list[WorkerInfo], timeout: Exception | None = None
) -> str:
    """The job's progress as the task's state and as an event; returns what it waits for.

    ``waiting`` says so while none of ``workers`` (the registry) hosts the job's spider,
    or while Redis is out of memory (``timeout``: a :class:`RedisOutOfMemory`).
    """
    progress = status.as_dict()
    progress["waiting"] = waiting_reason(workers, status.spider)
    if isinstance(timeout, RedisOutOfMemory):
        progress["waiting"] = str(timeout).partition(": ")[2]
    try:  # the result backend may be the Redis that is out of memory
        task.update_state(state="PROGRESS", meta=progress)
    except redis.exceptions.OutOfMemoryError as exc:
        logger.debug("progress not stored: %s", exc)
    try:
        task.send_event("task-progress", progress=progress)
    except Exception:  # monitoring only: never fail the job over an event
        logger.debug("progress event not sent", exc_info=True)
    return str(progress["waiting"])


def run_producer(task: Task, spider: str) -> dict[str, Any]:
    """The body of ``celery_crawl.produce``: one backpressure-aware tick (see producer)."""
    project = project_of(task.app)
    project.check_hostable(spider)
    # the spider's settings, its custom_settings included: one crawler for the tick's jobs
    crawler = project.crawler(spider)
    settings, spidercls = crawler.settings, crawler.spidercls
    producer = project.components(crawler).producer(spider)

    limits, args = producer_job_settings(settings)

    def start(source: str, job_id: str) -> None:
        seeds = [parse_seed(spidercls, source)]
        given = check_job(
            spider,
            seeds,
            priority=0,
            job_id=job_id,
            limits=limits,
            args=args,
            source=source_id(source),
        )
        start_crawl(task.app, project, crawler, given)

    schedule = project.components(crawler).schedule(spider)
    sources_path = setting(settings, "PRODUCER_SOURCES_FILE")
    if sources_path:  # the file changed: its sources into the schedule first
        sources_file.sync_file(schedule, sources_path)
    if len(schedule):  # sources on their own schedules: those that are due
        return run_schedule(task, crawler, schedule, (limits, args))
    sources = producible(spidercls, producer.sources(setting(settings, "PRODUCER_SOURCES")))
    tick = producer.tick(sources, start)
    return {"produced": dict(tick.produced), "sources": tick.sources, "queued": tick.queued}


def source_id(source: str) -> str:
    """The job's source for a source of ``PRODUCER_SOURCES``: the text itself when it is a
    valid source id (a forum id), else a digest of it (a URL), so that a hit-expiring
    filter counts each source's crawls apart."""
    if JOB_ID.fullmatch(source):
        return source
    return "src-" + hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()[:20]


def run_schedule(
    task: Task,
    crawler: Crawler,
    schedule: Schedule,
    defaults: tuple[dict[str, float], dict[str, str]],
) -> dict[str, Any]:
    """A tick of the spider's schedule: a job for each source due (celery_crawl.producer.schedule).

    A source's own limits and arguments win over ``PRODUCER_LIMITS`` and ``PRODUCER_ARGS``.
    """
    limits, args = defaults
    project, settings, spider = project_of(task.app), crawler.settings, crawler.spidercls.name

    def start(reserved: Reserved) -> None:
        source = reserved.source
        given = check_job(
            spider,
            source.seeds,
            priority=source.priority,
            job_id=reserved.job_id,
            limits=limits | source.limits,
            args=args | source.args,
            source=source.id,
        )
        given = dataclasses.replace(given, due_at=reserved.due_at, reserved_at=reserved.reserved_at)
        start_crawl(task.app, project, crawler, given)

    tick = schedule.tick(
        start,
        job_cap=setting(settings, "PRODUCER_JOB_CAP"),
        queue_cap=setting(settings, "PRODUCER_QUEUE_CAP"),
        faster=setting(settings, "PRODUCER_ADAPTIVE_FASTER"),
        slower=setting(settings, "PRODUCER_ADAPTIVE_SLOWER"),
    )
    produced = {reserved.source.id: reserved.job_id for reserved in tick.produced}
    return {"produced": produced, "still_due": tick.still_due, "queued": tick.queued}


def producer_job_settings(settings: Any) -> tuple[dict[str, float], dict[str, str]]:
    """``PRODUCER_LIMITS`` and ``PRODUCER_ARGS``, checked before any source is reserved."""
    try:
        limits = check_limits(setting(settings, "PRODUCER_LIMITS") or None)
        return limits, check_args(setting(settings, "PRODUCER_ARGS") or None)
    except BadInput as exc:
        raise ConfigError(f"PRODUCER_LIMITS or PRODUCER_ARGS: {exc}") from None


def producible(spidercls: Any, sources: list[str]) -> list[str]:
    """The sources whose seed passes the input rules: the others, logged, are not reserved."""
    kept = []
    for source in sources:
        try:
            check_seeds([parse_seed(spidercls, source)])
        except BadInput as exc:
            logger.error("producer: source %s left out: %s", quote(source), exc)
            continue
        kept.append(source)
    return kept
