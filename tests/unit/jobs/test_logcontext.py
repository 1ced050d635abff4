"""The tag a hosted crawler's log lines get: from Scrapy's extra, a line's request, the context."""

from __future__ import annotations

import asyncio
import contextvars
import logging

from scrapy import Request, Spider
from scrapy.http import Response

from celery_crawl.jobs import logcontext
from celery_crawl.jobs.logcontext import CrawlFormatter, crawl_tag
from celery_crawl.jobs.signals import JOB_META


class NamedSpider(Spider):
    name = "named"


def record(msg: str, args: object = (), **extra: object) -> logging.LogRecord:
    """A record as ``logger.info(msg, args, extra=extra)`` makes it (a dict: named arguments)."""
    wrapped = args if isinstance(args, tuple) else (args,)
    made = logging.LogRecord("scrapy.core.engine", logging.INFO, __file__, 1, msg, wrapped, None)
    made.__dict__.update(extra)
    return made


def test_the_spider_comes_from_scrapys_extra_and_the_job_from_the_lines_request() -> None:
    request = Request("http://site.test/", meta={JOB_META: "j1"})
    response = Response("http://site.test/", request=request)
    spider = NamedSpider()
    assert crawl_tag(record("Spider opened", spider=spider)) == "[named]"
    crawled = record("Crawled %(request)s", {"request": request}, spider=spider)
    assert crawl_tag(crawled) == "[named job=j1]"
    assert crawl_tag(record("x %(src)s", {"src": response}, spider=spider)) == "[named job=j1]"
    assert crawl_tag(record("a line of no crawler")) == ""


def test_the_context_names_spider_and_job_inside_a_coroutine_only() -> None:
    async def line_in_a_task() -> str:
        logcontext.enter("named", "j2")
        return crawl_tag(record("a callback's line"))

    assert asyncio.run(line_in_a_task()) == "[named job=j2]"
    assert crawl_tag(record("after it")) == "", "the task's context stays its own"

    async def lines_outside_a_task() -> list[str]:
        logcontext.enter("named", "j2")
        loop = asyncio.get_running_loop()
        outside: asyncio.Future[str] = loop.create_future()
        loop.call_soon(lambda: outside.set_result(crawl_tag(record("a plain call"))))
        return [await outside]

    assert asyncio.run(lines_outside_a_task()) == ["[named]"]


def test_the_formatter_puts_the_tag_before_the_message_and_leaves_the_record_as_it_was() -> None:
    formatter = CrawlFormatter(logging.Formatter("%(levelname)s %(message)s"))
    line = record("100%% of %(n)d pages", {"n": 3}, spider=NamedSpider())
    assert formatter.format(line) == "INFO [named] 100% of 3 pages"
    assert (line.msg, line.args) == ("100%% of %(n)d pages", {"n": 3})
    assert formatter.format(record("plain %s", ("line",))) == "INFO plain line"


def test_a_reactor_call_from_another_thread_runs_in_a_jobs_context_unless_detached() -> None:
    """Twisted's asyncio reactor runs its due calls in the context of the call that armed
    its timer: here a job's coroutine (as a download slot's delay does), then a call from
    the hosting thread (as ``callFromThread`` makes it) in the same turn of the loop."""
    from twisted.internet.asyncioreactor import AsyncioSelectorReactor

    loop = asyncio.new_event_loop()
    reactor = AsyncioSelectorReactor(loop)  # not installed: only its timer is used
    tags: dict[str, str] = {}
    started: list[asyncio.Task[None]] = []

    def shutdown(label: str) -> None:  # as a crawler's stop: it starts a coroutine
        async def closing() -> None:
            tags[label] = crawl_tag(record("Closing spider (shutdown)", spider=NamedSpider()))

        started.append(loop.create_task(closing()))

    def from_the_hosting_thread() -> None:
        reactor.callLater(0, shutdown, "plain")
        reactor.callLater(0, logcontext.detached(shutdown), "detached")

    async def a_jobs_callback() -> None:
        logcontext.enter("named", "j3")
        reactor.callLater(0, lambda: None)
        loop.call_soon(from_the_hosting_thread, context=contextvars.Context())

    async def main() -> None:
        await loop.create_task(a_jobs_callback())
        for _ in range(100):  # bounded: both run within a few turns of the loop
            if len(tags) == 2:
                return
            await asyncio.sleep(0.01)

    try:
        loop.run_until_complete(main())
    finally:
        reactor.removeReader(reactor.waker)
        reactor.waker.connectionLost(None)  # its pipe closed
        loop.close()
    assert tags == {"plain": "[named job=j3]", "detached": "[named]"}
