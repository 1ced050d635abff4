"""Per-job stat changes, gathered from Scrapy signals.

The scheduler writes them in the same script call as the acks
(``queue/lua/enqueue.lua``), before the job can finish.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from celery_crawl.jobs.signals import job_error, job_items, job_of, job_stat


class JobStats:
    """Per-job stat changes, buffered until the scheduler's next flush."""

    def __init__(self) -> None:
        self._deltas: Counter[tuple[str, str]] = Counter()

    def add(self, job: str, field: str, delta: int = 1) -> None:
        if job:
            self._deltas[(job, field)] += delta

    def drain(self) -> list[tuple[str, str, int]]:
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
        self.add(job, "pages")
        self.add(job, f"status/{response.status}")
        if request.meta.get("playwright"):  # scrapy-playwright's: rendered by a browser
            self.add(job, "browser/rendered")

    def on_items(self, response: Any, count: int) -> None:
        # counted once per callback, not per item: a signal per item costs a task each
        self.add(job_of(response), "items", count)

    def on_item_dropped(self, item: Any, response: Any, exception: Any, spider: Any) -> None:
        self.add(job_of(response), "items", -1)
        self.add(job_of(response), "items_dropped")

    def on_item_error(self, item: Any, response: Any, spider: Any, failure: Any) -> None:
        self.add(job_of(response), "items", -1)
        self.add(job_of(response), f"errors/item/{failure.type.__name__}")

    def on_spider_error(self, failure: Any, response: Any, spider: Any) -> None:
        self.add(job_of(response), f"errors/{failure.type.__name__}")
        self.add(job_of(response), "errors")  # CLOSESPIDER_ERRORCOUNT's count: callback errors

    def on_job_error(self, request: Any, kind: str) -> None:
        self.add(job_of(request), f"errors/{kind}")

    def on_job_stat(self, request: Any, field: str) -> None:
        self.add(job_of(request), field)
