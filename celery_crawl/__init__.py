"""celery_crawl: Scrapy crawls hosted by Celery workers, sharing one Redis queue.

The public API, loaded lazily (``import celery_crawl`` loads neither Celery
nor Scrapy, and changes nothing in either)::

    from celery_crawl import create_app, crawl

    app = create_app("myproject", "myproject.settings")  # a Celery app
    job = crawl("myspider", [{"url": "https://example.com/"}], app=app)
    job.wait(timeout=600)                                 # the job's statistics

- :func:`create_app`: the Celery app factory (:mod:`celery_crawl.app.factory`);
- :func:`crawl`, :func:`find_job`: start a job, or find one by id; :func:`sources`:
  a spider's sources on their own schedules, each a :class:`Source`
  (:mod:`celery_crawl.app.client`, :mod:`celery_crawl.producer.schedule`);
- :class:`Job`, :class:`JobStatus`: the handle ``crawl()`` returns, and a
  job's live progress (:mod:`celery_crawl.jobs.handle`);
- for spiders and pipelines: :func:`job_args` (a job's spider arguments),
  :func:`item_job` (an item's job), and the signals :data:`job_opened` and
  :data:`job_finished` (:mod:`celery_crawl.jobs.signals`);
- the exceptions (:mod:`celery_crawl.core.errors`), all subclasses of
  :class:`CeleryCrawlError`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from celery_crawl.core import exports as _moved

__version__ = "0.1.0"

_moved.install()  # old module paths still import (celery_crawl.core.exports.MOVED)

# public name -> the module that defines it
_EXPORTS = {
    "create_app": "celery_crawl.app.factory",
    "crawl": "celery_crawl.app.client",
    "find_job": "celery_crawl.app.client",
    "sources": "celery_crawl.app.client",
    "Source": "celery_crawl.producer.schedule",
    "Job": "celery_crawl.jobs.handle",
    "JobStatus": "celery_crawl.jobs.handle",
    "job_args": "celery_crawl.jobs.signals",
    "item_job": "celery_crawl.jobs.signals",
    "job_opened": "celery_crawl.jobs.signals",
    "job_finished": "celery_crawl.jobs.signals",
    **{
        name: "celery_crawl.core.errors"
        for name in (
            "CeleryCrawlError",
            "ConfigError",
            "BadInput",
            "RedisUnavailable",
            "EncodeError",
            "DecodeError",
            "UnknownSpider",
            "BadSeed",
            "UnknownJob",
            "JobTimeout",
            "RedisOutOfMemory",
            "JobFailed",
            "JobIncomplete",
            "ScriptError",
            "CookieError",
        )
    },
}
__all__ = [
    "BadInput",
    "BadSeed",
    "CeleryCrawlError",
    "ConfigError",
    "CookieError",
    "DecodeError",
    "EncodeError",
    "Job",
    "JobFailed",
    "JobIncomplete",
    "JobStatus",
    "JobTimeout",
    "RedisOutOfMemory",
    "RedisUnavailable",
    "ScriptError",
    "Source",
    "UnknownJob",
    "UnknownSpider",
    "crawl",
    "create_app",
    "find_job",
    "item_job",
    "job_args",
    "job_finished",
    "job_opened",
    "sources",
]

if TYPE_CHECKING:
    from celery_crawl.app.client import crawl, find_job, sources
    from celery_crawl.app.factory import create_app
    from celery_crawl.core.errors import (
        BadSeed,
        CeleryCrawlError,
        ConfigError,
        CookieError,
        DecodeError,
        EncodeError,
        JobFailed,
        JobIncomplete,
        JobTimeout,
        RedisOutOfMemory,
        RedisUnavailable,
        ScriptError,
        UnknownJob,
        UnknownSpider,
    )
    from celery_crawl.jobs.handle import Job, JobStatus
    from celery_crawl.jobs.signals import item_job, job_args, job_finished, job_opened
    from celery_crawl.producer.schedule import Source


def __getattr__(name: str) -> Any:
    # Celery and Scrapy load only when asked for, not on `import celery_crawl`
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'celery_crawl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
