"""Per-job stat changes, gathered from Scrapy signals.

The scheduler writes them in the same script call as the acks
(``queue/lua/enqueue.lua``), before the job can finish. A change that belongs to a
request the scheduler handed out (its page, status code, items, errors) is held
with that request until its ack, and travels with the ack: a process killed
before the ack loses it with the lease, and the page, fetched again, is counted
once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from celery_crawl.jobs.signals import job_error, job_items, job_of, job_stat

Deltas = dict[tuple[str, str], int]  # (job, field) -> change


class JobStats:
    """Per-job stat changes: a handed-out request's held until its ack, the others
    buffered until the scheduler's next flush."""

    def __init__(self) -> None:
        self._deltas: Counter[tuple[str, str]] = Counter()
        self._held: dict[Any, Deltas] = {}  # request handed out -> its changes, until its ack

    def add(self, job: str, field: str, delta: int = 1, request: Any = None) -> None:
        """Count ``delta`` in ``job``'s ``field``: with ``request``'s ack if it is held."""
        if job:
            into = self._deltas if request is None else self._held.get(request, self._deltas)
            into[(job, field)] = into.get((job, field), 0) + delta

    def hold(self, request: Any) -> None:
        """Keep ``request``'s changes until :meth:`release`: its lease is not acked yet."""
        self._held[request] = {}

    def release(self, request: Any) -> Deltas:
        """``request``'s changes, to write with its ack; no longer held."""
        return self._held.pop(request, None) or {}

    def forget_held(self) -> None:
        """The held requests' leases go back unacked: their pages are fetched again."""
        self._held.clear()

    def drain(self) -> list[tuple[str, str, int]]:
        """Every change not held: to write now."""
        deltas = [(job, field, n) for (job, field), n in self._deltas.items() if n]
        self._deltas.clear()
        return deltas

    def connect(self, signals_manager: Any) -> None:
        from scrapy import signals

        signals_manager.connect(self.on_response, signal=signals.response_received)
        signals_manager.connect(self.on_items, signal=job_items)
        signals_manager.connect(self.on_item_dropped, signal=signals.item_dropped)
        signals_manager.connect(self.on_item_error, signal=signals.item_error)
        signals_manager.connect(self.on_spider_error, signal=signals.spider_error)
        signals_manager.connect(self.on_job_error, signal=job_error)
        signals_manager.connect(self.on_job_stat, signal=job_stat)

    def on_response(self, response: Any, request: Any, spider: Any) -> None:
        job = job_of(request)
        self.add(job, "pages", request=request)
        self.add(job, f"status/{response.status}", request=request)
        if request.meta.get("playwright"):  # scrapy-playwright's: rendered by a browser
            self.add(job, "browser/rendered", request=request)

    def on_items(self, response: Any, count: int) -> None:
        # counted once per callback, not per item: a signal per item costs a task each
        self._of_response(response, "items", count)

    def on_item_dropped(self, item: Any, response: Any, exception: Any, spider: Any) -> None:
        self._of_response(response, "items", -1)
        self._of_response(response, "items_dropped")

    def on_item_error(self, item: Any, response: Any, spider: Any, failure: Any) -> None:
        self._of_response(response, "items", -1)
        self._of_response(response, f"errors/item/{failure.type.__name__}")

    def on_spider_error(self, failure: Any, response: Any, spider: Any) -> None:
        self._of_response(response, f"errors/{failure.type.__name__}")
        self._of_response(response, "errors")  # CLOSESPIDER_ERRORCOUNT's count: callback errors

    def on_job_error(self, request: Any, kind: str) -> None:
        self.add(job_of(request), f"errors/{kind}", request=request)

    def on_job_stat(self, request: Any, field: str) -> None:
        self.add(job_of(request), field, request=request)

    def _of_response(self, response: Any, field: str, delta: int = 1) -> None:
        self.add(job_of(response), field, delta, request=getattr(response, "request", None))
