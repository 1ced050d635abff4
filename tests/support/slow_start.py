"""An extension whose ``engine_started`` handler takes ``ENGINE_START_DELAY`` seconds.

A real one might warm a cache or log in first. Meanwhile the spider is open but its
engine does not run yet: the window in which a stop must not be lost. Off (0) by default.
"""

from __future__ import annotations

from typing import Any

from scrapy import signals
from scrapy.exceptions import NotConfigured


class SlowEngineStart:
    def __init__(self, delay: float) -> None:
        self.delay = delay

    @classmethod
    def from_crawler(cls, crawler: Any) -> SlowEngineStart:
        delay = crawler.settings.getfloat("ENGINE_START_DELAY")
        if delay <= 0:
            raise NotConfigured
        extension = cls(delay)
        crawler.signals.connect(extension.engine_started, signal=signals.engine_started)
        return extension

    def engine_started(self) -> Any:
        from twisted.internet import reactor, task

        return task.deferLater(reactor, self.delay, lambda: None)  # the engine waits for it
