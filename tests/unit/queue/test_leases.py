"""How long a lease lasts is decided in the queue package alone: a policy of lease times
reaches the scripts' deadlines and the scheduler's timings with nothing else changed."""

from __future__ import annotations

import ast
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

import celery_crawl
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.queue.leases import LeaseTimes
from celery_crawl.queue.queues import PriorityQueue
from celery_crawl.scheduler.scheduler import Scheduler

LIBRARY = Path(celery_crawl.__file__).parent
# the modules that may know a lease's own time: the policy, the queue that runs its
# scripts, and the registry of settings
LEASE_OWNERS = {"queue/leases.py", "queue/queues.py", "core/defaults.py"}


@dataclass(frozen=True)
class Uneven(LeaseTimes):
    """A policy whose leases last from 1.5 s (the ones it gives) to 30 s."""

    seconds: float = 1.5

    @property
    def longest(self) -> float:
        return 30.0


@pytest.mark.parametrize("seconds", [0, -1, math.nan, math.inf])
def test_a_lease_time_not_above_zero_is_refused_naming_its_setting(seconds: float) -> None:
    with pytest.raises(ConfigError, match="SCHEDULER_LEASE_SECONDS"):
        LeaseTimes(seconds)


def test_the_lease_time_is_read_from_its_setting(make_crawler: Any) -> None:
    settings = make_crawler(SCHEDULER_LEASE_SECONDS="2.5").settings
    times = LeaseTimes.from_settings(settings)
    assert times == LeaseTimes(2.5) and times.shortest == times.longest == 2.5


def test_a_policys_lease_and_renewal_set_its_deadlines(client: redis.Redis, prefix: str) -> None:
    """The queue takes each deadline from its policy, in the lease and at each renewal
    (20 s: neither the default's 10 s nor the policy's longest)."""
    keys = SpiderKeys.build("forum", prefix=prefix)
    queue = PriorityQueue(client, keys, leases=Uneven(20.0))
    queue.push(b"a")
    before = int(time.time() * 1000)  # Redis's TIME, in whole ms, is not before this
    (lease,) = queue.lease()
    deadline = client.zscore(keys.inflight, lease.member)
    assert deadline is not None and before + 20_000 <= deadline <= time.time() * 1000 + 20_000
    client.zadd(keys.inflight, {lease.member: deadline - 5_000})  # as if 5 s had passed
    assert queue.renew([lease.member]) == 1
    renewed = client.zscore(keys.inflight, lease.member)
    assert renewed is not None and deadline - 100 <= renewed <= time.time() * 1000 + 20_000


def test_the_schedulers_timings_follow_the_policys_bounds(
    make_crawler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy chosen where the setting is read reaches the scheduler unchanged: it renews
    within the shortest lease and waits out the longest."""
    monkeypatch.setattr(LeaseTimes, "from_settings", classmethod(lambda cls, settings: Uneven()))
    scheduler = Scheduler.from_crawler(make_crawler(SCHEDULER_REQUEUE_INTERVAL=5.0))
    assert scheduler.queue.leases == Uneven()
    assert scheduler.maintenance_interval == pytest.approx(0.5)  # a third of the shortest
    assert scheduler.memory.requeue_after == 30.0  # no requeue for the longest after a full Redis


def lease_time_uses(path: Path) -> list[str]:
    """Where ``path`` reads a lease's own time: ``.leases.<x>`` but for the two bounds, the
    setting's name, or the queue's ``lease_seconds``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            value = node.value  # ``x.leases.<attr>``, or ``leases.<attr>`` once bound to a name
            on_leases = (isinstance(value, ast.Attribute) and value.attr == "leases") or (
                isinstance(value, ast.Name) and value.id == "leases"
            )
            if on_leases and node.attr not in ("shortest", "longest"):
                found.append(f"{path.name}:{node.lineno} .leases.{node.attr}")
            if node.attr == "lease_seconds":
                found.append(f"{path.name}:{node.lineno} .lease_seconds")
        elif isinstance(node, ast.Constant) and node.value == "SCHEDULER_LEASE_SECONDS":
            found.append(f"{path.name}:{node.lineno} SCHEDULER_LEASE_SECONDS")
    return found


def test_outside_the_queue_package_only_the_two_bounds_are_read() -> None:
    """So a per-lease policy changes the queue package and its setting, nothing else."""
    modules = [p for p in LIBRARY.rglob("*.py") if str(p.relative_to(LIBRARY)) not in LEASE_OWNERS]
    assert LIBRARY / "scheduler" / "scheduler.py" in modules
    uses = [use for module in modules for use in lease_time_uses(module)]
    assert uses == []
    assert lease_time_uses(LIBRARY / "queue" / "queues.py")  # the owner's are found
    scheduler = (LIBRARY / "scheduler" / "scheduler.py").read_text()
    assert "leases.shortest" in scheduler and "leases.longest" in scheduler


def entries_made(path: Path) -> list[str]:
    """The functions of ``path`` that call ``Entry(...)`` (by name or as an attribute)."""
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and "Entry" in (
                getattr(node.func, "id", None),
                getattr(node.func, "attr", None),
            ):
                found.append(f"{path.relative_to(LIBRARY)}:{function.name}")
    return found


def test_entries_are_made_from_requests_in_one_place(client: redis.Redis) -> None:
    """So a lease time per request is read in one method, ``Base.entry``: the library makes
    entries there, and in ``Base.push`` (a payload, no request), nowhere else."""
    made = [where for path in LIBRARY.rglob("*.py") for where in entries_made(path)]
    assert sorted(made) == ["queue/queues.py:entry", "queue/queues.py:push"], made
    keys = SpiderKeys.build("s", prefix="p")
    from scrapy import Request

    request = Request("https://Example.com/a", priority=3)
    entry = PriorityQueue(client, keys).entry(request, b"payload", None, "j")
    assert (entry.priority, entry.job, entry.site) == (3, "j", "")  # site limits off
