"""A Redis out of memory: no lease while full, no requeue for a lease time after."""

from __future__ import annotations

import time

import redis

from celery_crawl.scheduler.memory import OutOfMemory


def test_full_until_a_write_goes_through_then_no_requeue_for_a_lease_time() -> None:
    memory = OutOfMemory("forum", requeue_after=0.2, stats=None)
    assert not memory.full and memory.requeue_due and not memory.room_again()
    memory.refused(redis.exceptions.OutOfMemoryError("OOM command not allowed"), held=3)
    assert memory.full and not memory.requeue_due
    assert memory.room_again()
    assert not memory.full and not memory.requeue_due  # the holders renew first
    assert not memory.room_again()  # told once
    time.sleep(0.25)
    assert memory.requeue_due


def test_opening_leaves_expired_leases_to_their_holders_for_a_lease_time() -> None:
    memory = OutOfMemory("forum", requeue_after=0.2, stats=None)
    memory.opened()
    assert not memory.requeue_due
    time.sleep(0.25)
    assert memory.requeue_due
