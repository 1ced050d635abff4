"""Log lines that say whose they are: the spider and the job of a hosted crawler's lines.

A worker process hosts a crawler per spider on one reactor thread, so a line
such as ``Spider opened`` says nothing of whose it is. In a hosting process,
:func:`install` wraps the formatter of each handler of the root logger in
:class:`CrawlFormatter`, which puts a tag before the message::

    [forum job=3f2a...] Crawled (200) <GET https://...> (referer: None)
    [forum] Spider opened
    celery's own lines, and any line of no crawler, are left as they were

The spider is, first found first: the ``spider`` Scrapy's components give
in ``extra`` (``spider.logger`` does too), the ``crawler`` some give instead,
or the spider of the log context. The job is that of the request or response
among the line's arguments (Scrapy's ``Crawled``, ``Scraped from``,
``Retrying``, ``Filtered ...`` lines carry one), or the job of the log context.

The log context is a context variable. The reactor runs every coroutine in a
context of its own, copied from the one that started it, so a value set in
a coroutine holds for what it runs and starts, and nowhere else:

- :class:`LogContextExtension` sets the spider when a crawler starts, so
  every line of that crawler's engine and components names it;
- :class:`LogContextDownloaderMiddleware` sets spider and job as a request
  goes through the downloader middlewares, and
  :class:`LogContextSpiderMiddleware` as a response goes to its callback,
  the items it yields to the pipelines, and the requests to the scheduler;
- ``celery_crawl.scheduler.participation`` sets them while the process leaves a job.

A job of the context counts only inside a coroutine (an asyncio task): a
plain reactor call made from a job's callback (the engine's next loop)
copies the context, but works on other jobs' requests.

Nor is the context of a call from another thread always its caller's:
Twisted's asyncio reactor runs every due ``callLater`` in the context of
whichever call armed its timer, which may be a job's coroutine (a download
slot's delay); a call from another thread that falls due with it (more likely
on a busy reactor) runs there too. Work that the hosting thread starts in the
reactor and that is no job's (the crawlers' start, the worker's shutdown)
goes through :func:`detached`.

It runs for every line: a few attribute reads, and a context variable's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from contextvars import Context, ContextVar
from typing import TYPE_CHECKING, Any, ParamSpec, Self, TypeVar

from celery_crawl.jobs.signals import job_of

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

# (spider, job) of the code running now; "" when unknown
_current: ContextVar[tuple[str, str]] = ContextVar("celery_crawl_log", default=("", ""))
# the keys of a line's arguments that may hold its request or response
_SUBJECT_KEYS = ("request", "response", "src")
P = ParamSpec("P")
R = TypeVar("R")


def enter(spider: str, job: str = "") -> None:
    """The code running now, and what it starts from now on, works for ``spider`` and ``job``."""
    _current.set((spider, job))


def detached(func: Callable[P, R]) -> Callable[P, R]:
    """``func`` run in a fresh context: what it logs and starts works for no job but
    one it enters itself, whichever context the reactor runs it in. For a plain
    function: a coroutine function's body would run later, in the reactor's context."""

    @functools.wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return Context().run(func, *args, **kwargs)

    return run


def crawl_tag(record: logging.LogRecord) -> str:
    """``[spider job=ID]``, ``[spider]``, or ``""`` for a line of no crawler."""
    spider, job = _current.get()
    named = getattr(record, "spider", None) or getattr(record, "crawler", None)
    if named is not None:
        spider = _name(named) or spider
    job = _subject_job(record.args) or (job if job and _in_task() else "")
    if not spider:
        return f"[job={job}]" if job else ""
    return f"[{spider} job={job}]" if job else f"[{spider}]"


def _name(named: Any) -> str:
    """The spider's name, from a spider or a crawler (or a name)."""
    if isinstance(named, str):
        return named
    name = getattr(named, "name", None) or getattr(getattr(named, "spidercls", None), "name", "")
    return name if isinstance(name, str) else ""


def _subject_job(args: Any) -> str:
    if not isinstance(args, dict):
        return ""
    for key in _SUBJECT_KEYS:
        subject = args.get(key)
        if subject is not None and not isinstance(subject, str):
            return job_of(subject)
    return ""


def _in_task() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:  # no event loop running in this thread
        return False


class CrawlFormatter(logging.Formatter):
    """A handler's formatter, with :func:`crawl_tag` before each message."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        tag = crawl_tag(record)
        if not tag:
            return self.inner.format(record)
        saved = record.msg, record.args
        record.msg, record.args = f"{tag} {record.getMessage()}", None
        try:
            return self.inner.format(record)
        finally:
            record.msg, record.args = saved


def install(logger: logging.Logger | None = None) -> None:
    """Tag the lines of every handler of ``logger`` (the root logger); once per handler."""
    for handler in (logger or logging.getLogger()).handlers:
        if not isinstance(handler.formatter, CrawlFormatter):
            handler.setFormatter(CrawlFormatter(handler.formatter or logging.Formatter()))


class LogContextExtension:
    """``EXTENSIONS``: the crawler's lines name its spider (hosted crawlers have it)."""

    def __init__(self, crawler: Crawler) -> None:
        enter(crawler.spidercls.name)  # in the context the crawler's engine starts from

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)


class LogContextDownloaderMiddleware:
    """``DOWNLOADER_MIDDLEWARES``: a download's lines name its spider and job."""

    def __init__(self, crawler: Crawler) -> None:
        self.spider = crawler.spidercls.name

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        enter(self.spider, job_of(request))


class LogContextSpiderMiddleware:
    """``SPIDER_MIDDLEWARES``: a callback's lines, and its items', name its spider and job."""

    def __init__(self, crawler: Crawler) -> None:
        self.spider = crawler.spidercls.name

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def process_spider_input(self, response: Response, spider: Spider | None = None) -> None:
        enter(self.spider, job_of(response))
