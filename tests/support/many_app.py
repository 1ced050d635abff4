"""The Celery app of a worker hosting many spiders, with a task that reports on its process."""

from __future__ import annotations

import threading
from typing import Any

from celery_crawl import create_app

app = create_app("many_app", "tests.support.many_settings")


@app.task(name="tests.reactor_facts")
def reactor_facts() -> dict[str, Any]:
    """The reactor set-up and threads of the worker process that runs this task."""
    from scrapy.resolver import dnscache
    from twisted.internet import reactor
    from twisted.internet.threads import blockingCallFromThread

    pool = reactor.getThreadPool()
    return {
        "dns_cached": sorted(dnscache.keys()),
        "dns_cache_limit": dnscache.limit,
        "pool_max": pool.max,
        "pool_working": len(pool.working),
        "pool_threads": len(pool.threads),
        "resolver": type(reactor.resolver).__name__,
        "name_resolver": type(reactor.nameResolver).__name__,
        "threads": sorted(t.name for t in threading.enumerate()),
        "reap_intervals": blockingCallFromThread(reactor, reap_intervals),
    }


def reap_intervals() -> list[float]:
    """In the reactor (a looping call that runs is briefly in no list): how often Twisted's
    children of ``spawnProcess`` are reaped."""
    from twisted.internet import reactor, task
    from twisted.internet.process import reapAllProcesses

    return [
        call.func.interval
        for call in reactor.getDelayedCalls()
        if isinstance(call.func, task.LoopingCall) and call.func.f is reapAllProcesses
    ]
