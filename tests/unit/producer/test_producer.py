"""The backpressure-aware producer, on a real server: caps, fairness, atomic reservation."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import redis

from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.producer.producer import Producer
from celery_crawl.producer.schedule import Schedule, Source
from celery_crawl.queue.queues import PriorityQueue

FORUMS = [f"{i:05d}" for i in range(1, 8)]


def starter(queue: PriorityQueue, requests_per_job: int = 1) -> Any:
    """Start a real job with seed requests, as the producer task does."""

    def start(source: str, job_id: str) -> None:
        seeds = [Entry(f"{source}-{i}".encode(), job=job_id) for i in range(requests_per_job)]
        queue.start_job(job_id, seeds, {"spider": "forum", "seeds": source})

    return start


def finish_all(queue: PriorityQueue) -> None:
    """Consume the queue as workers would: lease, then ack every request."""
    for _ in range(1000):
        leases = queue.lease(100)
        if not leases:
            return
        queue.push_many([], acks=[lease.member for lease in leases])


def queue_memory(client: redis.Redis, keys: SpiderKeys) -> int:
    """Bytes Redis uses for the queue: the level index and every level's list."""
    levels = [keys.level(int(p)) for p in client.zrange(keys.queue, 0, -1)]
    return sum(int(client.memory_usage(key) or 0) for key in [keys.queue, *levels])


def stats(client: redis.Redis, keys: SpiderKeys) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(keys.stats).items()}


def test_the_job_cap_holds_production_back(
    client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue
) -> None:
    producer = Producer(client, keys, job_cap=3)
    first = producer.tick(FORUMS, starter(queue))
    assert [source for source, _ in first.produced] == FORUMS[:3]
    second = producer.tick(FORUMS, starter(queue))
    assert second.produced == []  # three still running: at the cap
    counted = stats(client, keys)
    assert counted["producer/produced"] == 3
    assert counted["producer/held_back"] == (7 - 3) + 7


def test_a_running_source_is_skipped_and_finished_ones_free_their_slot(
    client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue
) -> None:
    producer = Producer(client, keys, job_cap=3)
    sources = FORUMS[:3]
    producer.tick(sources, starter(queue))
    first_job = dict(producer.reserve([]).produced)  # no-op tick
    assert first_job == {}
    leases = queue.lease(3)  # one request per forum, in order
    queue.push_many([], acks=[leases[2].member])  # the third forum's job is done
    queue.release([lease.member for lease in leases[:2]])
    tick = producer.tick(sources, starter(queue))  # starts at the first forum again
    assert [source for source, _ in tick.produced] == [sources[2]]
    assert stats(client, keys)["producer/skipped_running"] == 2


def test_round_robin_reaches_every_source_within_ceil_sources_over_cap(
    client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue
) -> None:
    producer = Producer(client, keys, job_cap=3)
    seen: list[str] = []
    for _ in range(math.ceil(len(FORUMS) / 3)):
        tick = producer.tick(FORUMS, starter(queue))
        seen += [source for source, _ in tick.produced]
        finish_all(queue)
    assert set(seen) == set(FORUMS)  # every forum within ceil(7 / 3) = 3 ticks
    # and it keeps going round: the next tick starts where the last one stopped
    tick = producer.tick(FORUMS, starter(queue))
    assert [source for source, _ in tick.produced] == (FORUMS * 2)[len(seen) : len(seen) + 3]


def test_queue_stays_at_the_cap_when_consumers_are_gone(
    client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue
) -> None:
    producer = Producer(client, keys, job_cap=100, queue_cap=50)
    batch = 20  # requests a job enqueues at once
    lengths, memory = [], []
    for _ in range(60):  # beat keeps running; nobody consumes
        producer.tick(FORUMS, starter(queue, batch))
        lengths.append(len(queue))
        memory.append(queue_memory(client, keys))
        # jobs never finish, so mark their sources free to force production pressure
        client.delete(keys.producer_running)
    assert max(lengths) <= 50 + len(FORUMS) * batch  # the cap plus at most one batch
    assert lengths[-1] == lengths[len(lengths) // 2]  # flat, not growing
    assert 0 < memory[-1] <= 1.05 * memory[len(memory) // 2]  # the queue's Redis memory too
    assert stats(client, keys)["producer/held_back"] > 0


def test_two_producers_at_once_never_double_produce(
    client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue
) -> None:
    reserved: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def run() -> None:
        producer = Producer(client, keys, job_cap=100)
        barrier.wait(timeout=30)
        tick = producer.reserve(FORUMS)
        with lock:
            reserved.extend(source for source, _ in tick.produced)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(reserved) == FORUMS  # each exactly once


def test_sources_from_the_redis_set_override_the_setting(
    client: redis.Redis, keys: SpiderKeys
) -> None:
    producer = Producer(client, keys)
    assert producer.sources(["00001"]) == ["00001"]
    client.sadd(keys.sources, "00009", "00003")
    assert producer.sources(["00001"]) == ["00003", "00009"]


def test_a_job_that_fails_to_start_releases_its_source(
    client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue
) -> None:
    producer = Producer(client, keys, job_cap=2)

    def broken(source: str, job_id: str) -> None:
        raise RuntimeError("site down")

    assert len(producer.tick(FORUMS[:2], broken).produced) == 2
    assert client.hlen(keys.producer_running) == 0
    assert len(producer.tick(FORUMS[:2], starter(queue)).produced) == 2


def test_produced_jobs_take_the_producers_limits_and_spider_arguments(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The produce task's logic, run eagerly; the jobs it starts are real, in Redis."""
    from celery_crawl import create_app
    from celery_crawl.app.client import find_job

    monkeypatch.setenv("REDIS_URL", redis_url)
    settings = {
        "CELERY_CRAWL_KEY_PREFIX": prefix,
        "PRODUCER_SOURCES": ["00001"],
        "PRODUCER_LIMITS": {"pages": 7},
        "PRODUCER_ARGS": {"lang": "en"},
    }
    app = create_app("producing", "tasks.settings", settings=settings)
    tick = app.tasks["celery_crawl.produce"].apply(args=("forum",)).get()
    assert list(tick["produced"]) == ["00001"]
    job = find_job(app, tick["produced"]["00001"])
    assert job is not None
    status = job.status()
    assert (status.limits, status.args) == ({"pages": 7.0}, {"lang": "en"})
    job.cancel()


def test_damaged_producer_keys_heal_in_the_tick(
    client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue
) -> None:
    """A reservation that cannot be read is forgotten; a cursor or count that is not a
    number starts from 0; a running hash of the wrong type is moved aside."""
    client.hset(keys.producer_running, mapping={FORUMS[0]: "garbage", FORUMS[1]: "|"})
    client.set(keys.producer_cursor, "not a number")
    client.hset(keys.stats, "producer/produced", "text")
    producer = Producer(client, keys, job_cap=len(FORUMS), queue_cap=100)
    tick = producer.tick(FORUMS, starter(queue))
    assert sorted(source for source, _ in tick.produced) == FORUMS
    assert int(client.hget(keys.stats, "producer/produced") or 0) == len(FORUMS)

    client.delete(keys.producer_running)
    client.rpush(keys.producer_running, "a list")
    finish_all(queue)
    tick = producer.tick(FORUMS, starter(queue))
    assert len(tick.produced) == len(FORUMS)
    assert client.type(keys.producer_running + "~damaged") == b"list"
    assert int(client.hget(keys.stats, "celery_crawl/damaged/keys") or 0) == 1


def test_a_sources_set_of_the_wrong_type_is_a_clear_error(
    client: redis.Redis, keys: SpiderKeys
) -> None:
    client.set(keys.sources, "00001,00002")
    with pytest.raises(ConfigError, match="must be a set of source ids"):
        Producer(client, keys).sources(FORUMS)
    assert client.get(keys.sources) == b"00001,00002"  # application data: never moved


def test_a_source_put_on_the_schedule_while_its_job_ran_is_not_forgotten(
    client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue
) -> None:
    """The running hash is the schedule's too: a tick of the source list (the schedule
    emptied meanwhile) that forgets the finished job makes the scheduled source due."""
    schedule = Schedule(client, keys)
    schedule.put(Source("board", [{"forum_id": "00001"}], 60))
    tick = schedule.tick(starter_of_sources(queue), job_cap=5, queue_cap=1000, faster=1, slower=1)
    assert [reserved.source.id for reserved in tick.produced] == ["board"]
    assert client.zscore(keys.schedule_due, "board") is None  # running: not due
    finish_all(queue)  # its job ends; no schedule tick has seen it yet
    Producer(client, keys).reserve([])  # a tick of the source list
    assert client.zscore(keys.schedule_due, "board") is not None  # due again, not lost
    tick = schedule.tick(starter_of_sources(queue), job_cap=5, queue_cap=1000, faster=1, slower=1)
    assert [reserved.source.id for reserved in tick.produced] == ["board"]
    schedule.pause("board")  # while its second job runs
    finish_all(queue)
    Producer(client, keys).reserve([])
    assert client.zscore(keys.schedule_due, "board") is None  # paused: not made due


def starter_of_sources(queue: PriorityQueue) -> Any:
    start = starter(queue)
    return lambda reserved: start(reserved.source.id, reserved.job_id)
