"""A job's participants, against a real server: join, the end's notice, leave, and the dead."""

from __future__ import annotations

import threading
import time

import redis

from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import JobTimeout
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.jobs.handle import Job
from celery_crawl.jobs.stats import JobStats
from celery_crawl.queue.queues import Base, PriorityQueue
from celery_crawl.scheduler.participation import JobInfo, Participation
from tests.support.waiting import wait_for


def queue(client: redis.Redis, prefix: str) -> Base:
    return PriorityQueue(client, SpiderKeys.build("paths", prefix=prefix))


def start(q: Base, job: str, **fields: str) -> Job:
    created, _ = q.start_job(job, [Entry(b"seed", 0, None, job)], {"spider": "paths", **fields})
    assert created
    return Job(job, "paths", q.client, q.keys)


def finish(q: Base) -> None:
    while leases := q.lease(100):
        q.ack([lease.member for lease in leases])


def test_join_reads_args_and_depth_and_joins_only_a_running_job(
    client: redis.Redis, prefix: str
) -> None:
    q = queue(client, prefix)
    start(q, "j", args='{"category": "books"}', **{"limit/depth": "2"})
    q.register(scheduler_id="s1", seconds=30)
    assert q.job_store.join("j", "s1") == ("running", '{"category": "books"}', "2")
    assert client.hkeys(q.keys.job_participants("j")) == [b"s1"]
    assert q.job_store.join("j", "") == ("running", '{"category": "books"}', "2")  # read only
    assert client.hlen(q.keys.job_participants("j")) == 1
    q.job_store.end("j", "enough")
    assert q.job_store.join("j", "s2")[0] == "closed"
    assert client.hkeys(q.keys.job_participants("j")) == [b"s1"]
    assert q.job_store.join("nope", "s1") == ("", "", "")


def test_the_end_is_told_to_each_participant_and_wait_returns_after_the_last_leaves(
    client: redis.Redis, prefix: str
) -> None:
    q = queue(client, prefix)
    job = start(q, "j")
    for scheduler in ("s1", "s2"):
        q.register(scheduler, 30)
        q.job_store.join("j", scheduler)
    heard = client.pubsub()
    heard.subscribe(q.keys.job_ended("s1"), q.keys.job_ended("s2"))
    finish(q)
    assert job.status().finished
    notices = [heard.get_message(timeout=1) for _ in range(4)]  # what wakes each process
    heard.close()
    assert sorted(m["channel"] for m in notices if m and m["type"] == "message") == sorted(
        q.keys.job_ended(s).encode() for s in ("s1", "s2")
    )
    assert q.job_store.take_ended("s1", 10) == ["j"] and q.job_store.take_ended("s2", 10) == ["j"]
    assert q.job_store.take_ended("s1", 10) == []  # once
    try:
        job.wait(timeout=0.5)
        raise AssertionError("wait() returned while two processes were still in the job")
    except JobTimeout:
        pass
    assert q.job_store.leave("j", "s1") == 1
    assert job.participants() == 1
    waited: list[dict[str, object]] = []
    waiter = threading.Thread(target=lambda: waited.append(job.wait(timeout=10)))
    waiter.start()
    time.sleep(0.2)
    assert not waited  # still s2
    assert q.job_store.leave("j", "s2") == 0
    waiter.join(10)
    assert waited and waited[0]["state"] == "done"
    assert q.job_store.leave("j", "s2") == 0  # leaving twice changes nothing


def test_a_participant_whose_registration_lapsed_is_not_waited_for(
    client: redis.Redis, prefix: str
) -> None:
    q = queue(client, prefix)
    job = start(q, "j")
    registered = time.monotonic()
    q.register("dead", 2.0)  # registered for 2 s, never renewed: a killed process
    q.job_store.join("j", "dead")
    q.register("alive", 30)
    q.job_store.join("j", "alive")
    finish(q)
    assert job.participants() == 2 or time.monotonic() - registered >= 2.0  # (a slow machine)
    lapsed = wait_for(lambda: job.participants() == 1, 10, "the lapsed participant dropped")
    assert time.monotonic() - registered >= 2.0 - 0.1, lapsed  # not before its registration lapsed
    q.job_store.leave("j", "alive")
    assert job.wait(timeout=5)["state"] == "done"


def test_a_running_jobs_participants_are_kept_and_read_with_its_hash(
    client: redis.Redis, prefix: str
) -> None:
    """Job.wait's one look (job_settle.lua): the job's hash, the clock and its participants;
    a lapsed registration drops its participant only once the job has ended."""
    q = queue(client, prefix)
    start(q, "j")
    q.register("dead", 0.1)
    q.job_store.join("j", "dead")
    time.sleep(0.2)
    count, raw, read_at = q.job_store.settle("j")
    assert count == 1  # still running: not dropped
    assert raw[b"state"] == b"running" and abs(read_at - time.time()) < 5
    finish(q)
    count, raw, _ = q.job_store.settle("j")
    assert (count, raw[b"state"]) == (0, b"done")


def test_a_lost_notice_is_found_by_the_state_check(client: redis.Redis, prefix: str) -> None:
    """The end's notice can be lost (Redis restarted); check() reads the states instead."""
    q = queue(client, prefix)
    start(q, "lost")
    start(q, "running")
    # holds: a lease of each is still in the engine, so nothing closes yet
    part = Participation(q, "s1", JobStats(), holds=lambda job: True)
    assert part.info("lost") == part.info("running") == JobInfo()
    q.job_store.end("lost", "a reason")
    client.delete(q.keys.job_ended("s1"))  # the notice is gone
    part.check()
    assert part.ending == {"lost"}
    assert part.info("lost") is None  # a request of it leased meanwhile is discarded
    assert part.info("running") == JobInfo()


def test_a_finished_job_is_kept_for_its_keep_time_and_a_week_without_one(
    client: redis.Redis, prefix: str
) -> None:
    q = queue(client, prefix)
    start(q, "short", keep="30")
    start(q, "closed", keep="40")
    start(q, "default")
    q.register("s1", 30)
    for job in ("short", "closed", "default"):
        q.job_store.join(job, "s1")
    running_ttl = client.ttl(q.keys.job_participants("short"))
    assert running_ttl > 6 * 24 * 3600  # a running job's participants are not cut short
    q.job_store.end("closed", "enough")
    finish(q)
    for job, keep in (("short", 30), ("closed", 40), ("default", 7 * 24 * 3600)):
        for key in (q.keys.job(job), q.keys.job_participants(job), q.keys.job(job) + ":done"):
            assert keep - 5 < client.ttl(key) <= keep, (job, key)
