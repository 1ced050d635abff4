"""An extension whose ``engine_started`` handler waits until the file ``ENGINE_START_GATE``
exists (60 s at most).

A real one might warm a cache or log in first. Meanwhile the spider is open but its
engine does not run yet: the window in which a stop must not be lost. The test holds
the window open as long as it needs. Off (no gate) by default.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

POLL = 0.05
MOST = 60.0


class SlowEngineStart:
    def __init__(self, gate: Path) -> None:
        self.gate = gate

    @classmethod
    def from_crawler(cls, crawler: Any) -> SlowEngineStart:
        gate = crawler.settings.get("ENGINE_START_GATE")
        if not gate:
            raise NotConfigured
        extension = cls(Path(gate))
        crawler.signals.connect(extension.engine_started, signal=signals.engine_started)
        return extension

    def engine_started(self) -> Any:
        """A Deferred the engine waits for: it fires once the gate is open."""
        return self._wait(time.monotonic() + MOST)

    def _wait(self, deadline: float) -> Any:
        from twisted.internet import defer, reactor, task

        if self.gate.exists() or time.monotonic() > deadline:
            return defer.succeed(None)
        return task.deferLater(reactor, POLL, self._wait, deadline)
