"""The scheduler's own settings, read once (``SchedulerSettings.from_settings``).

Each field is a setting of :mod:`celery_crawl.core.defaults`, where its meaning
and default are (and in ``docs/settings.md``). The queue's and the dedup
filter's settings are read by the factory that builds them
(:mod:`celery_crawl.scheduler.components`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.scheduler.crawl_state import START_MODES

MIN_REGISTRATION_SECONDS = 10.0  # outlives missed renewals; lapsed, a job stops waiting on it


def _default(name: str) -> Any:
    return SETTINGS[name].default


@dataclass(frozen=True)
class SchedulerSettings:
    persist: bool = _default("SCHEDULER_PERSIST")
    flush_on_start: bool = _default("SCHEDULER_FLUSH_ON_START")
    start_requests: str = _default("SCHEDULER_START_REQUESTS")
    idle_before_close: float = _default("SCHEDULER_IDLE_BEFORE_CLOSE")
    prefetch: int = _default("SCHEDULER_PREFETCH")
    batch_size: int = _default("SCHEDULER_BATCH_SIZE")
    requeue_interval: float = _default("SCHEDULER_REQUEUE_INTERVAL")
    flush_delay: float = _default("SCHEDULER_FLUSH_DELAY")
    allow_eviction: bool = _default("CELERY_CRAWL_ALLOW_EVICTION")

    def __post_init__(self) -> None:
        if self.start_requests not in START_MODES:
            raise ConfigError(
                f"SCHEDULER_START_REQUESTS is {self.start_requests!r}: use 'once' or 'every'"
            )

    @classmethod
    def from_settings(cls, settings: Any) -> Self:
        return cls(
            persist=setting(settings, "SCHEDULER_PERSIST"),
            flush_on_start=setting(settings, "SCHEDULER_FLUSH_ON_START"),
            start_requests=setting(settings, "SCHEDULER_START_REQUESTS"),
            idle_before_close=setting(settings, "SCHEDULER_IDLE_BEFORE_CLOSE"),
            prefetch=setting(settings, "SCHEDULER_PREFETCH"),
            batch_size=setting(settings, "SCHEDULER_BATCH_SIZE"),
            requeue_interval=setting(settings, "SCHEDULER_REQUEUE_INTERVAL"),
            flush_delay=setting(settings, "SCHEDULER_FLUSH_DELAY"),
            allow_eviction=setting(settings, "CELERY_CRAWL_ALLOW_EVICTION"),
        )

    def maintenance_interval(self, shortest_lease: float) -> float:
        """Seconds between heartbeats and maintenance runs: three in the shortest lease
        time at least (:attr:`celery_crawl.queue.leases.LeaseTimes.shortest`)."""
        return min(self.requeue_interval, shortest_lease / 3)

    def registration_seconds(self, shortest_lease: float) -> float:
        """How long a scheduler counts as open without a renewal (a killed process's expires)."""
        return max(3 * self.maintenance_interval(shortest_lease), MIN_REGISTRATION_SECONDS)
