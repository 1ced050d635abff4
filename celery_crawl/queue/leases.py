"""How long a lease lasts: the one place that decides a leased request's deadline.

A process that leases a request holds it until the lease's deadline, which its
heartbeat pushes back while it lives (``queue/lua/renew.lua``). A lease not renewed
by then goes back to the front of its level for any process (``queue/lua/requeue.lua``).
Every lease lasts ``SCHEDULER_LEASE_SECONDS`` today.

Code outside this package sees two bounds only, never a lease's own time:

- :attr:`LeaseTimes.shortest`: a holder renews well within it (the scheduler's
  heartbeat beats at least three times in it);
- :attr:`LeaseTimes.longest`: any lease not renewed for that long has lapsed (the
  waits for lost requests, and after an out of memory, cover it).

So a policy that gives each lease its own time is a subclass here, with its setting
read in :meth:`LeaseTimes.from_settings`, and the two scripts that set deadlines
(``lease.lua``, ``renew.lua``) with their ARGV layouts (:mod:`celery_crawl.queue.queues`).
A time by what an entry carries (its priority, its job id, or its site, which it
carries when site limits are on) changes no code outside this package. A time by
request (a ``Request.meta`` key) is also a field of the entry:
:meth:`celery_crawl.queue.queues.Base.entry` is where entries are made from requests,
and the entry's wire format, :mod:`celery_crawl.core.entries`, is the one Python module
of the library outside the package that changes (its size in Lua is generated from
it; ``jobs/lua/job_start.lua``'s header names its fields). ``docs/architecture.md``
walks the change, file by file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Self

from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.errors import ConfigError


@dataclass(frozen=True)
class LeaseTimes:
    """Every lease lasts ``seconds`` (``SCHEDULER_LEASE_SECONDS``)."""

    seconds: float = SETTINGS["SCHEDULER_LEASE_SECONDS"].default

    def __post_init__(self) -> None:
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ConfigError(f"SCHEDULER_LEASE_SECONDS is {self.seconds!r}: use seconds above 0")

    @classmethod
    def from_settings(cls, settings: Any) -> Self:
        return cls(setting(settings, "SCHEDULER_LEASE_SECONDS"))

    @property
    def shortest(self) -> float:
        """Seconds: no lease is shorter; a holder renews its leases well within it."""
        return self.seconds

    @property
    def longest(self) -> float:
        """Seconds: no lease is longer; one not renewed for so long has lapsed."""
        return self.seconds

    def lease_args(self) -> dict[str, int]:
        """``lease.lua``'s arguments for the deadlines of the entries it leases."""
        return {"lease_duration_ms": self._ms(self.seconds)}

    def renew_args(self, seconds: float | None = None) -> dict[str, int]:
        """``renew.lua``'s arguments: held leases pushed back ``seconds`` (default: their
        lease time) from now."""
        return {"lease_duration_ms": self._ms(seconds or self.seconds)}

    @staticmethod
    def _ms(seconds: float) -> int:
        return int(seconds * 1000)
