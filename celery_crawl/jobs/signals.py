"""What travels with a job's requests and items: the meta keys, the signals, the item -> job map.

Every request of a job carries its id in ``request.meta[JOB_META]`` (stamped on
children by ``celery_crawl.hosting.middleware``); an item's job is known from the
callback that yielded it until it leaves the pipelines (:func:`item_job`). The
signals are Scrapy signals of a crawler, sent with these objects as their ids.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

JOB_META = "celery_crawl_job"
JOB_PRIORITY_META = "celery_crawl_priority"
JOB_ARGS_META = "celery_crawl_args"  # the job's spider arguments, set when a request is leased
JOB_DEPTH_META = "celery_crawl_depth_limit"  # the job's depth limit, set when leased
# sent by the downloader middleware: a download of a job's request failed
job_error = object()
# sent by the spider middleware once per callback: how many items it yielded
job_items = object()

# sent by any component with (request, field): one more of ``field`` in the stats of
# the request's job (``celery_crawl.browser.middleware``: browser/render_needed ...)
job_stat = object()

# sent by the spider middleware: a callback of a job's response raised CloseSpider
job_end_asked = object()

# sent by the scheduler just before it acks the leases of finished pages (once per
# write, not per page): a handler holding their items in memory hands them to the OS
# (celery_crawl.hosting.feeds); one that raises keeps those acks from being sent
acks_due = object()

# Public signals, sent in each worker process that worked on a job
# (celery_crawl.scheduler.participation), with the job id and spider as arguments:
# job_opened(job_id, spider), before the process's first request of the job;
# job_finished(job_id, stats, spider), once the job has ended and every item
# this process scraped for it went through the pipelines (and their close_job).
job_opened = object()
job_finished = object()


def job_of(obj: Any) -> str:
    """The job id carried by a request or response, or ``""``."""
    meta = getattr(obj, "meta", None) or {}
    return str(meta.get(JOB_META) or "")


def job_args(obj: Any) -> dict[str, str]:
    """The spider arguments of the job of a response or request (``crawl(..., args=...)``).

    What ``scrapy crawl -a NAME=VALUE`` gives a spider, for one job: a hosted
    spider serves every job, so its attributes cannot hold them. Every request
    of the job has them once leased, children included. ``{}`` outside a job.
    """
    meta = getattr(obj, "meta", None) or {}
    return dict(meta.get(JOB_ARGS_META) or {})


# the job of each item on its way through the pipelines: id(item) -> job
_item_jobs: OrderedDict[int, str] = OrderedDict()
MAX_ITEMS_TRACKED = 100_000  # items in the pipelines at once; the oldest are forgotten beyond


def item_job(item: Any) -> str:
    """The job whose callback yielded ``item``, for item pipelines; ``""`` outside a job.

    Known from the moment the callback yields the item until it leaves the
    pipelines (scraped, dropped or failed). A pipeline that returns a new
    object instead of the item passes its job on with :func:`set_item_job`.
    """
    return _item_jobs.get(id(item), "")


def set_item_job(item: Any, job: str) -> None:
    """Record the job of an item (done by ``JobSpiderMiddleware`` for every item)."""
    if job:
        _item_jobs[id(item)] = job
        if len(_item_jobs) > MAX_ITEMS_TRACKED:
            _item_jobs.popitem(last=False)


def forget_item(item: Any, **_: Any) -> None:
    """The item left the pipelines: connected to item_scraped, item_dropped, item_error."""
    _item_jobs.pop(id(item), None)
