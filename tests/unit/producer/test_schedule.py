"""Sources on their own schedules, on a real server: due order, caps, pause, adaptive intervals."""

from __future__ import annotations

import itertools
import re
import threading
import time
from typing import Any

import pytest
import redis

from celery_crawl.core import scripts
from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import BadInput
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.producer.schedule import (
    Reserved,
    Schedule,
    Source,
    schedule_keys,
    splay_seconds,
)
from celery_crawl.queue.queues import PriorityQueue
from tests.support.round_trips import RoundTrips

FAST = {"job_cap": 100, "queue_cap": 100_000, "faster": 0.5, "slower": 2.0}


@pytest.fixture
def schedule(client: redis.Redis, keys: SpiderKeys) -> Schedule:
    return Schedule(client, keys)


def starter(queue: PriorityQueue, started: list[tuple[str, str]]) -> Any:
    """Start a real job of one seed request per source, as the producer task does."""

    def start(reserved: Reserved) -> None:
        source, job_id = reserved.source, reserved.job_id
        queue.start_job(job_id, [Entry(source.id.encode(), job=job_id)], {"spider": "forum"})
        started.append((source.id, job_id))

    return start


def finish_all(queue: PriorityQueue, items: int = 0) -> None:
    """Consume the queue as workers would; each job counts ``items`` items."""
    for _ in range(1000):
        leases = queue.lease(100)
        if not leases:
            return
        stats = [(lease.job, "items", items) for lease in leases if items]
        queue.push_many([], acks=[lease.member for lease in leases], job_stats=stats)


def backdate(client: redis.Redis, keys: SpiderKeys, seconds: float) -> None:
    """Move every reservation ``seconds`` into the past, as if that much time went by."""
    for source, value in client.hgetall(keys.producer_running).items():
        job, _, at = value.decode().partition("|")
        client.hset(keys.producer_running, source, f"{job}|{int(at) - int(seconds)}")


def test_due_sources_get_a_job_each_in_due_order_and_not_again_while_it_runs(
    schedule: Schedule, queue: PriorityQueue
) -> None:
    for name in ("b", "a", "c"):
        assert schedule.put(Source(name, seeds=[name], interval=60)) == "added"
        time.sleep(0.002)  # due times a millisecond or more apart: b, a, c
    started: list[tuple[str, str]] = []
    tick = schedule.tick(starter(queue, started), **FAST | {"job_cap": 2})
    assert [source for source, _ in started] == ["b", "a"]  # due order, under the job cap
    assert tick.still_due == 1
    schedule.tick(starter(queue, started), **FAST)
    assert [source for source, _ in started] == ["b", "a", "c"]
    assert schedule.tick(starter(queue, started), **FAST).produced == []  # all running
    assert schedule.get("a") is not None and schedule.get("a").running_job == started[1][1]  # type: ignore[union-attr]


def test_an_ended_job_makes_its_source_due_its_interval_after_it_started(
    schedule: Schedule, queue: PriorityQueue, client: redis.Redis, keys: SpiderKeys
) -> None:
    schedule.put(Source("a", seeds=["a"], interval=60))
    started: list[tuple[str, str]] = []
    before = time.time()
    schedule.tick(starter(queue, started), **FAST)
    finish_all(queue)
    assert schedule.tick(starter(queue, started), **FAST).produced == []  # not due yet
    state = schedule.get("a")
    assert state is not None and state.running_job is None and state.due_at is not None
    assert before + 59 <= state.due_at <= time.time() + 61
    schedule.put(Source("b", seeds=["b"], interval=60))
    schedule.tick(starter(queue, started), **FAST)
    backdate(client, keys, 61)  # b's job started 61 s ago and is still running
    finish_all(queue)
    schedule.tick(starter(queue, started), **FAST)  # its end found: due at once, produced
    assert [source for source, _ in started] == ["a", "b", "b"]


def test_a_reservation_says_when_its_source_was_due_and_the_next_due_counts_from_it(
    schedule: Schedule, queue: PriorityQueue
) -> None:
    schedule.put(Source("a", seeds=["a"], interval=60))
    before = schedule.get("a")
    assert before is not None and before.due_at is not None
    time.sleep(0.05)
    (reserved,) = schedule.tick(starter(queue, []), **FAST).produced
    assert reserved.job_id and reserved.source.id == "a"
    assert reserved.due_at == pytest.approx(before.due_at, abs=0.001)  # what the due set held
    assert reserved.due_at + 0.05 <= reserved.reserved_at <= time.time() + 1  # the tick's time
    finish_all(queue)
    assert schedule.tick(starter(queue, []), **FAST).produced == []  # its end found
    after = schedule.get("a")
    assert after is not None and after.due_at is not None
    # start to start, from the reservation's whole second (the running hash keeps seconds)
    assert after.due_at == pytest.approx(int(reserved.reserved_at) + 60, abs=0.001)


def test_a_paused_source_gets_no_job_and_a_resumed_one_is_due_at_once(
    schedule: Schedule, queue: PriorityQueue
) -> None:
    schedule.put(Source("a", seeds=["a"], interval=60))
    schedule.put(Source("p", seeds=["p"], interval=60), paused=True)
    assert schedule.pause("a") is True
    assert schedule.pause("nobody") is False
    started: list[tuple[str, str]] = []
    assert schedule.tick(starter(queue, started), **FAST).produced == []
    state = schedule.get("a")
    assert state is not None and state.paused and state.due_at is None
    assert schedule.resume("p") is True
    schedule.tick(starter(queue, started), **FAST)
    assert [source for source, _ in started] == ["p"]


def test_a_source_paused_while_its_job_runs_is_not_due_after_it(
    schedule: Schedule, queue: PriorityQueue, client: redis.Redis, keys: SpiderKeys
) -> None:
    schedule.put(Source("a", seeds=["a"], interval=1))
    started: list[tuple[str, str]] = []
    schedule.tick(starter(queue, started), **FAST)
    schedule.pause("a")
    backdate(client, keys, 5)
    finish_all(queue)
    assert schedule.tick(starter(queue, started), **FAST).produced == []
    schedule.resume("a")
    assert [r.source.id for r in schedule.tick(starter(queue, started), **FAST).produced] == ["a"]


def test_removed_sources_are_gone_and_a_changed_one_keeps_its_place(
    schedule: Schedule, queue: PriorityQueue
) -> None:
    schedule.put(Source("a", seeds=["a"], interval=60))
    schedule.put(Source("b", seeds=["b"], interval=60))
    due = schedule.get("a").due_at  # type: ignore[union-attr]
    assert schedule.put(Source("a", seeds=["a", "a2"], interval=30)) == "changed"
    assert schedule.put(Source("a", seeds=["a", "a2"], interval=30)) == "unchanged"
    assert schedule.get("a").due_at == due  # type: ignore[union-attr]
    assert schedule.remove("b") is True and schedule.remove("b") is False
    assert [source.id for source in schedule.sources()] == ["a"]
    started: list[tuple[str, str]] = []
    tick = schedule.tick(starter(queue, started), **FAST)
    assert [(source.id, source.seeds) for source, *_ in tick.produced] == [("a", ["a", "a2"])]


def test_the_queue_cap_holds_every_source_back(schedule: Schedule, queue: PriorityQueue) -> None:
    queue.push_many([Entry(b"waiting", fingerprint=b"w")])
    schedule.put(Source("a", seeds=["a"], interval=60))
    started: list[tuple[str, str]] = []
    tick = schedule.tick(starter(queue, started), **FAST | {"queue_cap": 1})
    assert (tick.produced, tick.still_due, tick.queued) == ([], 1, 1)


def test_adaptive_intervals_shorten_after_items_and_lengthen_without_within_bounds(
    schedule: Schedule, queue: PriorityQueue, client: redis.Redis, keys: SpiderKeys
) -> None:
    schedule.put(Source("busy", seeds=["b"], interval=100, adaptive=True, min_interval=30))
    schedule.put(Source("quiet", seeds=["q"], interval=100, adaptive=True, max_interval=300))
    started: list[tuple[str, str]] = []
    intervals: dict[str, list[float]] = {"busy": [], "quiet": []}
    for _ in range(3):
        schedule.tick(starter(queue, started), **FAST)
        busy_job = dict(started)["busy"]
        for lease in queue.lease(100):
            found = 5 if lease.job == busy_job else 0
            queue.push_many([], acks=[lease.member], job_stats=[(lease.job, "items", found)])
        backdate(client, keys, 1000)  # each job started long ago: due again at once
        schedule.tick(starter(queue, []), **FAST | {"job_cap": 0})  # ends seen, none started
        for name, seen in intervals.items():
            state = schedule.get(name)
            assert state is not None
            seen.append(state.interval)
        started.clear()
    assert intervals == {"busy": [50, 30, 30], "quiet": [200, 300, 300]}


def test_two_producers_at_once_start_each_due_source_once(
    client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue
) -> None:
    for i in range(200):
        Schedule(client, keys).put(Source(f"s{i:03d}", seeds=[i], interval=60))
    started: list[tuple[str, str]] = []
    lock = threading.Lock()

    def start(reserved: Reserved) -> None:
        with lock:
            started.append((reserved.source.id, reserved.job_id))

    def run() -> None:
        for _ in range(10):
            Schedule(client, keys).tick(start, **FAST | {"job_cap": 1000})

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(source for source, _ in started) == [f"s{i:03d}" for i in range(200)]


def test_a_job_that_could_not_start_gives_its_source_back(
    schedule: Schedule, queue: PriorityQueue
) -> None:
    schedule.put(Source("a", seeds=["a"], interval=60))

    def refuse(reserved: Reserved) -> None:
        raise RuntimeError("broker away")

    schedule.tick(refuse, **FAST)
    started: list[tuple[str, str]] = []
    schedule.tick(starter(queue, started), **FAST)
    assert [source for source, _ in started] == ["a"]
    assert schedule.get("a").interval == 60  # type: ignore[union-attr]


def test_putting_a_source_again_keeps_it_paused_and_what_it_learned(
    schedule: Schedule, queue: PriorityQueue, client: redis.Redis, keys: SpiderKeys
) -> None:
    busy = Source("busy", seeds=["b"], interval=100, adaptive=True, min_interval=10)
    schedule.put(busy)
    started: list[tuple[str, str]] = []
    schedule.tick(starter(queue, started), **FAST)
    finish_all(queue, items=3)
    schedule.tick(starter(queue, []), **FAST)  # its end seen: 100 s became 50 s
    assert schedule.get("busy").interval == 50  # type: ignore[union-attr]
    schedule.pause("busy")
    assert schedule.put(busy) == "unchanged"
    state = schedule.get("busy")
    assert state is not None and state.paused and state.interval == 50 and state.due_at is None
    assert schedule.put(busy, paused=False) == "unchanged"
    assert not schedule.get("busy").paused  # type: ignore[union-attr]
    schedule.put(Source("busy", seeds=["b"], interval=200, adaptive=True, min_interval=10))
    assert schedule.get("busy").interval == 200  # type: ignore[union-attr]  # a new interval


def test_an_adaptive_source_without_bounds_stays_within_a_minute_and_30_days(
    schedule: Schedule, queue: PriorityQueue, client: redis.Redis, keys: SpiderKeys
) -> None:
    schedule.put(Source("x", seeds=["x"], interval=100, adaptive=True))
    seen = []
    for _ in range(3):
        schedule.tick(starter(queue, []), **FAST)
        finish_all(queue, items=1)
        backdate(client, keys, 1000)
        schedule.tick(starter(queue, []), **FAST | {"job_cap": 0})
        seen.append(schedule.get("x").interval)  # type: ignore[union-attr]
    assert seen == [60, 60, 60]  # 100 s halved is 50 s: held at the minute


def test_a_definition_that_is_not_json_pauses_its_source_until_put_again(
    schedule: Schedule, queue: PriorityQueue, client: redis.Redis, keys: SpiderKeys
) -> None:
    schedule.put(Source("a", seeds=["a"], interval=60))
    client.hset(keys.schedule_sources, "a", "{not json")
    started: list[tuple[str, str]] = []
    assert schedule.tick(starter(queue, started), **FAST).produced == []
    assert client.sismember(keys.schedule_paused, "a")
    assert client.hget(keys.stats, "producer/sources_unreadable") == b"1"
    schedule.put(Source("a", seeds=["a"], interval=60), paused=False)
    schedule.tick(starter(queue, started), **FAST)
    assert [source for source, _ in started] == ["a"]


def test_a_definition_that_breaks_a_rule_pauses_its_source_even_under_an_odd_id(
    schedule: Schedule, queue: PriorityQueue, client: redis.Redis, keys: SpiderKeys
) -> None:
    """Written by hand into Redis: JSON, but no source's (an interval of 0, an id with a space)."""
    client.hset(keys.schedule_sources, "odd id", '{"id": "odd id", "interval": 0}')
    client.zadd(keys.schedule_due, {"odd id": 0})
    assert schedule.tick(starter(queue, []), **FAST).produced == []
    assert client.sismember(keys.schedule_paused, "odd id")
    assert schedule.tick(starter(queue, []), **FAST).produced == []  # not due again


def test_a_reservation_whose_job_never_started_is_due_again_with_its_interval(
    schedule: Schedule, queue: PriorityQueue, client: redis.Redis, keys: SpiderKeys
) -> None:
    schedule.put(Source("a", seeds=["a"], interval=100, adaptive=True, min_interval=10))
    schedule.tick(lambda reserved: None, **FAST)  # reserved; its job never created
    backdate(client, keys, 200)  # past the grace a reservation has to become a job
    started: list[tuple[str, str]] = []
    schedule.tick(starter(queue, started), **FAST)
    assert [source for source, _ in started] == ["a"]
    assert schedule.get("a").interval == 100  # type: ignore[union-attr]  # no job: no change


def test_a_source_the_spider_refuses_is_paused_not_tried_every_tick(
    schedule: Schedule, caplog: pytest.LogCaptureFixture
) -> None:
    schedule.put(Source("a", seeds=["a"], interval=60))

    def refuse(reserved: Reserved) -> None:
        raise BadInput("seed 'a': the spider takes a forum id")

    schedule.tick(refuse, **FAST)
    state = schedule.get("a")
    assert state is not None and state.paused
    assert "source 'a' paused: seed 'a': the spider takes a forum id" in caplog.text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"id": "a b"}, "source id 'a b'"),
        ({"id": "a", "adaptive": 0}, "adaptive 0: true or false"),
        ({"id": "a", "limits": None}, "limits None: a dict"),
        ({"id": "a", "interval": 0.5}, r"interval 0.5 s: from 1 s to a year"),
        ({"id": "a", "interval": "60"}, "interval '60': seconds"),
        ({"id": "a", "interval": 10, "min_interval": 20}, r"outside its bounds \[20, 10\]"),
        ({"id": "a", "seeds": "x"}, "seeds 'x': a list"),
        ({"id": "a", "every": 3}, r"unknown fields \['every'\]"),
        ({"seeds": []}, "no id"),
    ],
)
def test_bad_definitions_are_refused_with_what_is_wrong(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(BadInput, match=message):
        Source.from_mapping(fields)


def test_a_definition_damaged_in_redis_is_left_out_and_logged(
    schedule: Schedule, client: redis.Redis, keys: SpiderKeys, caplog: pytest.LogCaptureFixture
) -> None:
    schedule.put(Source("good", seeds=["g"], interval=60))
    client.hset(keys.schedule_sources, "bad", "{not json")
    assert [source.id for source in schedule.sources()] == ["good"]
    assert "source 'bad' unreadable" in caplog.text


def test_sources_added_with_splay_are_first_due_across_their_interval_and_only_new_ones(
    schedule: Schedule, client: redis.Redis, keys: SpiderKeys
) -> None:
    """A thousand sources put at once with ``splay`` do not all come due in one tick."""
    sources = [Source(f"s{n}", seeds=[str(n)], interval=100) for n in range(1000)]
    before = time.time()
    for source in sources:
        schedule.put(source, splay=True)
    after = time.time()
    due = {
        k.decode(): v / 1000 for k, v in client.zrange(keys.schedule_due, 0, -1, withscores=True)
    }
    for source in sources:
        offset = splay_seconds(source)
        assert before + offset - 0.01 <= due[source.id] <= after + offset + 0.01
    offsets = sorted(splay_seconds(source) for source in sources)
    assert 0 <= offsets[0] < 1 and 99 < offsets[-1] < 100  # spread over the interval
    assert max(b - a for a, b in itertools.pairwise(offsets)) < 2  # with no large gap
    # a source put again keeps its due time: splay places new sources only
    changed = Source("s1", seeds=["other"], interval=100)
    assert schedule.put(changed, splay=True) == "changed"
    assert client.zscore(keys.schedule_due, "s1") / 1000 == pytest.approx(due["s1"], abs=0.002)
    assert schedule.put(Source("now", seeds=["x"], interval=100)) == "added"
    assert client.zscore(keys.schedule_due, "now") / 1000 <= time.time() + 0.01  # no splay: now


def test_every_state_is_read_in_one_round_trip_and_matches_each_read_alone(
    schedule: Schedule, queue: PriorityQueue, client: redis.Redis, keys: SpiderKeys
) -> None:
    for name in ("a", "b", "c"):
        schedule.put(Source(name, seeds=[name], interval=60, adaptive=name == "c"))
    schedule.pause("b")
    schedule.tick(starter(queue, []), **FAST | {"job_cap": 1})  # "a" runs a job
    client.hset(keys.schedule_sources, "broken", "not json")  # logged, left out
    pipelines: list[Any] = []
    real_pipeline = client.pipeline

    def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipelines.append(real_pipeline(*args, **kwargs))
        return pipelines[-1]

    client.pipeline = counted_pipeline  # type: ignore[method-assign]
    try:
        with RoundTrips(client) as trips:
            states = schedule.states()
    finally:
        del client.pipeline
    assert len(pipelines) == 1 and trips.count == 0  # one transaction, no command beside it
    assert [state.source.id for state in states] == ["a", "b", "c"]
    assert states == [schedule.get(name) for name in ("a", "b", "c")]
    assert states[0].running_job and states[1].paused and states[2].due_at is not None


def test_a_damaged_due_set_is_repaired_and_every_source_is_due_again(
    schedule: Schedule, client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue
) -> None:
    """Redis holding garbage: the due set moved aside loses every due time; the schedule
    is reconciled from its sources, so none starves (a paused one stays paused)."""
    for name in ("a", "b", "quiet"):
        schedule.put(Source(name, seeds=[name], interval=60))
    schedule.pause("quiet")
    client.delete(keys.schedule_due)
    client.set(keys.schedule_due, "garbage")
    started: list[tuple[str, str]] = []
    tick = schedule.tick(starter(queue, started), **FAST)  # refused, repaired, reconciled
    assert sorted(source.id for source, *_ in tick.produced) == ["a", "b"]
    assert client.exists(keys.schedule_due + "~damaged")  # moved aside, kept to look at
    client.hset(keys.schedule_intervals, "gone", 60)  # an entry of a source that is gone
    assert schedule.reconcile() == (0, 1)  # a and b run, quiet is paused: none made due


def test_the_schedule_keys_go_in_the_order_every_schedule_script_reads_them(
    keys: SpiderKeys,
) -> None:
    """One order, written once: ``producer/lua/include/schedule.lua`` reads the first five
    KEYS of every schedule script (its header and its code agree), and ``schedule_keys``
    passes them in that order."""
    fragment = scripts.files("include")["schedule"].read_text()
    header = re.findall(r"^--   KEYS\[(\d)\]  (\w+):", fragment, re.MULTILINE)
    assert [int(number) for number, _ in header] == [1, 2, 3, 4, 5]
    code = re.search(r"^local ([\w, ]+) = (KEYS\[1\].*)$", fragment, re.MULTILINE)
    assert code is not None
    names = code.group(1).split(", ")
    assert names == [name for _, name in header]
    assert re.findall(r"KEYS\[(\d)\]", code.group(2)) == ["1", "2", "3", "4", "5"]
    named = {"running": keys.producer_running}
    expected = [named.get(name) or getattr(keys, f"schedule_{name}") for name in names]
    assert schedule_keys(keys) == expected


SCHEDULE_KEYS = ["sources", "due", "paused", "intervals", "running"]


def damage(client: redis.Redis, keys: SpiderKeys, name: str) -> str:
    key = schedule_keys(keys)[SCHEDULE_KEYS.index(name)]
    client.delete(key)
    client.set(key, "garbage")
    return key


def assert_repaired(client: redis.Redis, key: str) -> None:
    assert client.type(key) != b"string", f"{key} still damaged"
    assert client.get(key + "~damaged") == b"garbage"  # moved aside by this call
    client.delete(key + "~damaged")


@pytest.mark.parametrize("damaged", SCHEDULE_KEYS)
def test_each_schedule_script_refuses_any_damaged_schedule_key_and_is_sent_again(
    client: redis.Redis, keys: SpiderKeys, queue: PriorityQueue, damaged: str
) -> None:
    """The five keys checked alike by every script (``schedule_guard``): a damaged one is
    moved aside, and the call goes through and does its work, for put, pause, resume and
    a release (a schedule each: one repair at most per ``REPAIR_SECONDS`` a schedule).
    A damaged sources hash loses the sources: pause and resume then find none."""
    lost = damaged == "sources"
    source = Source("a", seeds=["a"], interval=60)

    key = damage(client, keys, damaged)
    assert Schedule(client, keys).put(source) == "added"
    assert_repaired(client, key)
    assert Schedule(client, keys).get("a") is not None

    for pause in (True, False):
        Schedule(client, keys).put(source)
        key = damage(client, keys, damaged)
        schedule = Schedule(client, keys)
        switched = schedule.pause("a") if pause else schedule.resume("a")
        assert_repaired(client, key)
        assert switched is not lost
        state = schedule.get("a")
        assert (state is None) if lost else (state is not None and state.paused is pause)

    schedule = Schedule(client, keys)
    schedule.put(source, paused=False)
    moved: list[str] = []

    def refuse(reserved: Reserved) -> None:  # the key damaged while the job starts
        moved.append(damage(client, keys, damaged))
        raise RuntimeError("broker away")

    schedule.tick(refuse, **FAST)
    assert moved, "the source was reserved"
    assert_repaired(client, moved[0])
    state = schedule.get("a")
    assert (state is None) if lost else (state is not None and state.running_job is None)
