"""Every kind of key the project writes, damaged mid-crawl under a live worker.

A real worker (prefork, two processes) crawls the demo forum with the forum
app. Once 40 pages are in, one kind of key of both spiders of the forum group
is damaged: corrupted (wrong bytes, wrong members, wrong type) or deleted. Each
case then checks the outcome docs/failure-semantics.md promises for that key,
and every case checks what always holds: the worker lives, no exception reaches
Scrapy's engine, the job ends (no hang, no loop) and nothing stays leased.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_crawl import crawl
from celery_crawl.core.errors import JobTimeout, UnknownJob
from celery_crawl.core.keys import SpiderKeys
from tests.support.forum import FORUM, forum_seeds
from tests.support.workers import Worker

EXPECTED = FORUM.expected()
URLS = EXPECTED.pages + EXPECTED.not_found  # distinct URLs a complete crawl fetches
ITEMS = EXPECTED.posts + EXPECTED.comments
DAMAGE_AFTER_PAGES = 40
ENGINE_ERRORS = ("Exception in callback", "Unhandled error", "Unhandled Error")


def poison(job: bytes) -> list[bytes]:
    """The issue's kinds: random bytes, a job id then random bytes, empty, a length past the end."""
    return [os.urandom(40), bytes([len(job)]) + job + os.urandom(20), b"", bytes([60]) + b"ab"]


@dataclass
class Crawl:
    """A damaged crawl, once its job ended (``result`` None: the job is gone)."""

    result: dict[str, Any] | None
    damaged: int  # keys the damage touched
    client: redis.Redis
    spiders: list[SpiderKeys]
    fetched: Counter[str]  # path -> times the site served it
    log: str

    def stat(self, name: str) -> int:
        """A counter summed over the group's spiders (fields starting so, with a ``/*``)."""
        total = 0
        for keys in self.spiders:
            values = self.client.hgetall(keys.stats)
            for field, value in values.items():
                wanted = field.decode().startswith(name[:-1]) if name.endswith("*") else None
                if wanted or field.decode() == name:
                    total += int(value)
        return total

    def stat_reaches(self, name: str, at_least: int, timeout: float = 15) -> int:
        """The counter once it reaches ``at_least``: processes flush their stats every few s."""
        deadline = time.monotonic() + timeout
        while (value := self.stat(name)) < at_least and time.monotonic() < deadline:
            time.sleep(0.2)
        return value

    def dead_letters(self) -> int:
        return sum(int(self.client.llen(k.deadletter)) for k in self.spiders)

    def dead_letters_reach(self, at_least: int, timeout: float = 15) -> int:
        """The dead-letter records once they reach ``at_least`` (a bounded wait)."""
        deadline = time.monotonic() + timeout
        while (value := self.dead_letters()) < at_least and time.monotonic() < deadline:
            time.sleep(0.2)
        return value


Damage = Callable[[redis.Redis, SpiderKeys, str], int]


def levels(client: redis.Redis, keys: SpiderKeys) -> list[str]:
    return [f"{keys.queue}:{level.decode()}" for level in client.zrange(keys.queue, 0, -1)]


def parked_lists(client: redis.Redis, keys: SpiderKeys) -> list[bytes]:
    found = client.scan_iter(match=keys.parked + ":*", count=1000)
    return [key for key in found if client.type(key) == b"list"]


def wrong_type(client: redis.Redis, keys: list[Any]) -> int:
    for key in keys:
        client.delete(key)
        client.set(key, "not what it should be")
    return len(keys)


# -- the damage, per kind of key ------------------------------------------------


def poison_levels(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    client.rpush(f"{keys.queue}:100", *poison(job.encode()))
    client.rpush(f"{keys.queue}:101", *poison(job.encode()))
    client.zadd(keys.queue, {"100": -100, "101": -101})
    announce(client, keys)
    return 2


def announce(client: redis.Redis, keys: SpiderKeys) -> None:
    """The notice a push publishes, so that the crawlers meet the entries while their job
    runs; without it they meet them at Scrapy's 5-second engine heartbeat, and an entry
    that reads as a request of the ended job is then discarded with it (purged)."""
    client.publish(keys.signal, 1)


def poison_parked(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    found = parked_lists(client, keys)
    for key in found:
        client.rpush(key, *poison(job.encode()))
    announce(client, keys)
    return len(found)


def delete_queued(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    found = [*levels(client, keys), *parked_lists(client, keys)]
    return client.delete(*found) if found else 0


def wrong_type_levels(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return wrong_type(client, [*levels(client, keys), *parked_lists(client, keys)])


def junk_index(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    client.zadd(keys.queue, {"abc": -200, "7.5": -150, "": -300})
    client.zadd(keys.parked, {"no-such-site": 0, "": 0})
    return 2


def delete_index(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return client.delete(keys.queue, keys.parked)


def delete_inflight(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    """Once leases are held: a bounded wait, as a lease lives only from its pop to its ack.

    DEL itself is the check: it counts the set only when it held a lease at that moment
    (Redis drops an empty sorted set), where a ZCARD first could see a lease acked before
    the DEL reached it.
    """
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if client.delete(keys.inflight):
            return 1
        time.sleep(0.001)
    return 0


def junk_inflight(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return client.zadd(keys.inflight, {b"short": 0, os.urandom(30): 0})


def junk_signal(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    client.rpush(keys.signal, *[b"junk"] * 100)
    return 1


def wrong_type_inflight(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return wrong_type(client, [keys.inflight])


def wrong_type_signal(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return wrong_type(client, [keys.signal])


def delete_dedup(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    found = list(client.scan_iter(match=keys.dupefilter + ":*", count=1000))
    return client.delete(*found) if found else 0


def wrong_type_dedup(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    found = client.scan_iter(match=keys.dupefilter + ":*", count=1000)
    buckets = [key for key in found if not key.endswith((b":kind", b":count"))]
    client.set(keys.dupefilter_count, "not a number")
    return wrong_type(client, buckets) + 1


def junk_stats(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    """Once the counts are there: a process writes its stats every STATS_FLUSH_INTERVAL."""
    deadline = time.monotonic() + 3
    while not client.hexists(keys.stats, "response_received_count"):
        if time.monotonic() > deadline:
            return 0
        time.sleep(0.01)
    fields = client.hkeys(keys.stats)
    for field in fields:
        client.hset(keys.stats, field, "garbage")
    return len(fields)


def junk_stats_types(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    fields = client.hkeys(keys.stats_types)
    for field in fields:
        client.hset(keys.stats_types, field, "os.system")
    return len(fields)


def wrong_type_stats(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return wrong_type(client, [keys.stats, keys.stats_types])


def junk_job(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return client.hset(keys.job(job), mapping={"pending": "x", "done": "y"}) + 1


def delete_job(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return client.delete(keys.job(job))


def wrong_type_job(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    """The job hash is in the group's first spider's hash tag: damaged once."""
    return wrong_type(client, [keys.job(job)]) if keys.spider == "forum" else 0


def delete_job_index(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return client.delete(keys.job_states, keys.active_jobs)


def wrong_type_job_index(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return wrong_type(client, [keys.job_states, keys.active_jobs])


def routed_only(damage: Damage) -> Damage:
    """The damage on the detail spider only: the one the forum spider routes requests to."""

    def apply(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
        return damage(client, keys, job) if keys.spider == "forum_detail" else 0

    return apply


def text_dedup_count(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    """Issue 28's case: the count turned to text, the buckets left as they are."""
    client.set(keys.dupefilter_count, "abc")
    return 1


def wrong_type_index(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    return wrong_type(client, [keys.queue])


def wrong_type_sites_and_schedulers(client: redis.Redis, keys: SpiderKeys, job: str) -> int:
    """Each spider's open schedulers; the group's known sites and site hashes (once)."""
    damaged = wrong_type(client, [keys.open_schedulers])
    if keys.spider != "forum":
        return damaged
    found = client.scan_iter(match=keys.site_prefix + "*", count=1000)
    sites = [k for k in found if client.type(k) == b"hash" and not k.endswith(b"~limits")]
    return damaged + wrong_type(client, [keys.site_known, *sites])


# -- what each promises -----------------------------------------------------------


def complete(crawl: Crawl) -> None:
    """Every page fetched at least once, every item scraped at least once."""
    assert crawl.result is not None and crawl.result["state"] == "done", crawl.result
    assert len(crawl.fetched) == URLS
    assert crawl.result["items"] >= ITEMS


def exactly_complete(crawl: Crawl) -> None:
    """Complete, and not one page fetched twice."""
    complete(crawl)
    assert max(crawl.fetched.values()) == 1
    assert crawl.result is not None and crawl.result["items"] == ITEMS


def poison_dead_lettered_once(crawl: Crawl) -> None:
    exactly_complete(crawl)
    pushed = len(poison(b"j")) * 2 * len(crawl.spiders)
    assert crawl.dead_letters_reach(pushed) == pushed
    assert crawl.stat_reaches("celery_crawl/dead_letter/*", pushed) == pushed
    time.sleep(5)  # more than a lease time and its requeue interval: nothing cycles back
    assert crawl.dead_letters() == pushed
    assert crawl.stat("celery_crawl/dead_letter/*") == pushed


def parked_poison_dead_lettered(crawl: Crawl) -> None:
    exactly_complete(crawl)
    pushed = len(poison(b"j")) * crawl.damaged
    assert crawl.dead_letters_reach(pushed) == pushed  # no notice: met at a heartbeat


def lost_counted(crawl: Crawl) -> None:
    """The queued requests are gone: the job ends incomplete and says how many."""
    assert crawl.result is not None and crawl.result["state"] == "incomplete", crawl.result
    assert crawl.result["errors"]["lost"] > 0
    assert len(crawl.fetched) < URLS


def lost_counted_or_healed(crawl: Crawl) -> None:
    """What a deleted index hid is lost; nothing is when it named no queued request at
    that moment (every request leased, or only levels that had just emptied)."""
    assert crawl.result is not None
    if crawl.result["state"] == "done":
        complete(crawl)
    else:
        lost_counted(crawl)


def ends(crawl: Crawl) -> None:
    """Leases Redis forgot: their acks are skipped; the job ends, done or incomplete."""
    assert crawl.result is not None and crawl.result["state"] in ("done", "incomplete")
    if crawl.result["state"] == "incomplete":
        assert crawl.result["errors"]["lost"] > 0


def junk_leases_dead_lettered(crawl: Crawl) -> None:
    """Each junk member dead-lettered once: by the requeue when it expires, or, when its
    random bytes read as a request of no job (1 in about 250), queued again and
    dead-lettered by the first lease that meets it, which may come after the job ended."""
    exactly_complete(crawl)
    junk = 2 * len(crawl.spiders)
    assert crawl.dead_letters_reach(junk) == junk
    time.sleep(1)  # a record more would come within a requeue interval
    assert crawl.dead_letters() == junk


def moved_aside(crawl: Crawl) -> None:
    complete(crawl)
    assert crawl.stat_reaches("celery_crawl/damaged/keys", 1) >= 1
    assert crawl.client.keys(f"{crawl.spiders[0].queue.split('{')[0]}*~damaged")


def lost_moved_aside(crawl: Crawl) -> None:
    """The lists are moved aside before any lease pops from them; what they held is lost."""
    lost_counted_or_healed(crawl)
    assert crawl.stat_reaches("celery_crawl/damaged/keys", 1) >= 1


def leases_moved_aside(crawl: Crawl) -> None:
    """The in-flight set moved aside: as deleted, the leases it held are forgotten."""
    ends(crawl)
    assert crawl.stat_reaches("celery_crawl/damaged/keys", 1) >= 1


def job_moved_aside(crawl: Crawl) -> None:
    """A job hash of the wrong type is moved aside: the job is gone, as if deleted."""
    job_gone(crawl)
    assert crawl.stat_reaches("celery_crawl/damaged/keys", 1) >= 1


def stats_restarted(crawl: Crawl) -> None:
    exactly_complete(crawl)
    assert crawl.stat_reaches("celery_crawl/damaged/stats", 1) >= 1


def job_closed_damaged(crawl: Crawl) -> None:
    """Closed by the first script that adds to a damaged counter (or by the repair)."""
    assert crawl.result is not None and crawl.result["state"] == "closed"
    assert crawl.result["reason"].startswith("damaged: ")
    job = crawl.client.hgetall(crawl.spiders[0].job(crawl.result["job_id"]))
    assert any(field.endswith(b"~damaged") for field in job)  # the old value, kept


def no_loop(crawl: Crawl) -> None:
    """No page fetched more than twice (once more for a request whose lease was lost)."""
    assert crawl.fetched and max(crawl.fetched.values()) <= 2, crawl.fetched.most_common(3)


def routed_moved_aside(crawl: Crawl, key: str) -> None:
    """The routed spider's damaged key was moved aside and counted with that spider."""
    detail = crawl.spiders[1]
    assert crawl.client.exists(key + "~damaged")
    deadline = time.monotonic() + 15  # its stats reach Redis at the next flush
    while int(crawl.client.hget(detail.stats, "celery_crawl/damaged/keys") or 0) < 1:
        assert time.monotonic() < deadline, "the repair was not counted with forum_detail"
        time.sleep(0.2)


def routed_count_repaired(crawl: Crawl) -> None:
    """Issue 28: a job of 1 page after 60 s, one URL fetched 189 times, nothing moved."""
    complete(crawl)
    no_loop(crawl)
    routed_moved_aside(crawl, crawl.spiders[1].dupefilter_count)


def routed_index_repaired(crawl: Crawl) -> None:
    lost_counted_or_healed(crawl)
    no_loop(crawl)
    routed_moved_aside(crawl, crawl.spiders[1].queue)


def routed_leases_repaired(crawl: Crawl) -> None:
    ends(crawl)
    no_loop(crawl)
    routed_moved_aside(crawl, crawl.spiders[1].inflight)


def routed_stats_restarted(crawl: Crawl) -> None:
    complete(crawl)
    no_loop(crawl)
    assert crawl.stat_reaches("celery_crawl/damaged/stats", 1) >= 1


def sites_and_schedulers_moved_aside(crawl: Crawl) -> None:
    """Met by a response's feedback, a lease and each scheduler's renewal (every few s)."""
    complete(crawl)
    no_loop(crawl)
    forum, detail = crawl.spiders
    wanted = [forum.site_known, forum.open_schedulers, detail.open_schedulers]
    deadline = time.monotonic() + 15
    while not all(crawl.client.exists(key + "~damaged") for key in wanted):
        assert time.monotonic() < deadline, [
            k for k in wanted if not crawl.client.exists(k + "~damaged")
        ]
        time.sleep(0.2)


def job_gone(crawl: Crawl) -> None:
    """The job is unknown; its requests left drain (discarded), none loops."""
    assert crawl.result is None
    for keys in crawl.spiders:
        assert crawl.client.zcard(keys.queue) == crawl.client.zcard(keys.parked) == 0


CASES: dict[str, tuple[Damage, Callable[[Crawl], None]]] = {
    "level lists: poison entries": (poison_levels, poison_dead_lettered_once),
    "parked lists: poison entries": (poison_parked, parked_poison_dead_lettered),
    "level and parked lists: deleted": (delete_queued, lost_counted),
    "level and parked lists: wrong type": (wrong_type_levels, lost_moved_aside),
    "level index: junk members": (junk_index, exactly_complete),
    "level index: deleted": (delete_index, lost_counted_or_healed),
    "in-flight set: deleted": (delete_inflight, ends),
    "in-flight set: junk members": (junk_inflight, junk_leases_dead_lettered),
    "in-flight set: wrong type": (wrong_type_inflight, leases_moved_aside),
    "signal list: junk tokens": (junk_signal, exactly_complete),
    "signal list: wrong type": (wrong_type_signal, moved_aside),
    "dedup keys: deleted": (delete_dedup, complete),
    "dedup keys: wrong type, count not a number": (wrong_type_dedup, moved_aside),
    "stats hash: values not numbers": (junk_stats, stats_restarted),
    "stats type tags: junk": (junk_stats_types, exactly_complete),
    "stats hash and tags: wrong type": (wrong_type_stats, complete),
    "job hash: counters not numbers": (junk_job, job_closed_damaged),
    "job hash: deleted": (delete_job, job_gone),
    "job hash: wrong type": (wrong_type_job, job_moved_aside),
    "job index: deleted": (delete_job_index, exactly_complete),
    "job index: wrong type": (wrong_type_job_index, moved_aside),
    # the detail spider alone, while the forum spider routes requests to it (issue 28)
    "routed dedup count: text": (routed_only(text_dedup_count), routed_count_repaired),
    "routed level index: wrong type": (routed_only(wrong_type_index), routed_index_repaired),
    "routed in-flight set: wrong type": (routed_only(wrong_type_inflight), routed_leases_repaired),
    "routed stats hash: values not numbers": (routed_only(junk_stats), routed_stats_restarted),
    "open schedulers, sites: wrong type": (
        wrong_type_sites_and_schedulers,
        sites_and_schedulers_moved_aside,
    ),
}


def spiders_of(prefix: str) -> list[SpiderKeys]:
    """The forum group: the list spider and the detail spider its requests are routed to."""
    forum = SpiderKeys.build("forum", prefix=prefix)
    return [forum, SpiderKeys.build("forum_detail", group="forum", prefix=prefix)]


def damaged_crawl(
    damage: Damage,
    app: Celery,
    worker: Worker,
    site: Any,
    client: redis.Redis,
    prefix: str,
) -> Crawl:
    spiders = spiders_of(prefix)
    job = crawl("forum", forum_seeds(), app=app)
    deadline = time.monotonic() + 30
    while job.status().pages < DAMAGE_AFTER_PAGES and time.monotonic() < deadline:
        time.sleep(0.02)
    assert job.status().state == "running", "the crawl ended before the damage"
    damaged = sum(damage(client, keys, job.id) for keys in spiders)
    assert damaged > 0, "nothing was there to damage"
    try:
        result: dict[str, Any] | None = job.wait(timeout=60)
    except JobTimeout as exc:  # what the keys and the worker say: a hang is told, not guessed
        raise AssertionError(
            f"{exc}\n{keys_now(client, spiders[0])}\n{worker.output()[-6000:]}"
        ) from exc
    except UnknownJob:
        result = None
        deadline = time.monotonic() + 30  # its requests left drain
        while any(client.zcard(k.queue) or client.zcard(k.parked) for k in spiders):
            assert time.monotonic() < deadline, "the deleted job's requests never drained"
            time.sleep(0.2)
    assert site.wait_idle(10)
    fetched = Counter(arrival.path for arrival in site.arrivals())
    return Crawl(result, damaged, client, spiders, fetched, worker.output())


def keys_now(client: redis.Redis, keys: SpiderKeys) -> str:
    """The keys of ``keys``' group with their types and what they hold (sizes, a sorted
    set's first scores; not the dedup buckets): for the message of a crawl that did not end."""
    group = keys.queue[: keys.queue.index("}") + 1]  # every key of the group starts so
    found = (k.decode("utf-8", "replace") for k in client.scan_iter(match=group + "*", count=1000))
    return "\n".join(
        f"{key} {shown(client, key)}"[:300] for key in sorted(found) if ":dupefilter:" not in key
    )


def shown(client: redis.Redis, key: str) -> str:
    kind = client.type(key).decode()
    try:
        if kind == "zset":
            return f"zset {client.zrange(key, 0, 4, withscores=True)}"
        if kind == "hash":
            return f"hash {client.hgetall(key)}"
        if kind in ("list", "set"):
            return f"{kind} of {client.llen(key) if kind == 'list' else client.scard(key)}"
    except redis.RedisError as exc:  # its type changed meanwhile, say
        return f"{kind}, then {exc}"
    return kind


@pytest.mark.parametrize("case", list(CASES))
def test_damage_mid_crawl(
    case: str,
    env: dict[str, str],
    app: Celery,
    start_worker: Callable[..., Worker],
    state_client: redis.Redis,
    forum_site: Any,
    prefix: str,
    tmp_path: Path,
) -> None:
    damage, promise = CASES[case]
    env["SITE_RATE"] = "100"  # about 5 s of crawl: the damage lands in the middle
    worker = start_worker("damaged")
    result = damaged_crawl(damage, app, worker, forum_site, state_client, prefix)
    promise(result)
    assert worker.proc.poll() is None, "the worker died"
    assert not [line for line in result.log.splitlines() if any(e in line for e in ENGINE_ERRORS)]
    # a lease the process held when its job went is discarded (acked) when its engine next
    # asks, within Scrapy's 5 s heartbeat; one its process holds and never acks is renewed
    # by the process's heartbeat, and stays
    deadline = time.monotonic() + 7
    while sum(state_client.zcard(k.inflight) for k in result.spiders) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    for keys in result.spiders:
        assert state_client.zcard(keys.inflight) == 0, "a lease was left behind"


def test_routed_dedup_count_damaged_before_the_job(
    env: dict[str, str],
    app: Celery,
    start_worker: Callable[..., Worker],
    state_client: redis.Redis,
    forum_site: Any,
    prefix: str,
) -> None:
    """Issue 28 as found: the detail spider's count is text before a forum job starts, so
    the detail spider has nothing of its own to enqueue (and repair) until the forum
    spider's routed requests get through. Before: 1 page after 60 s, one URL fetched 189
    times, the forum queue growing, nothing moved aside."""
    env["SITE_RATE"] = "100"
    worker = start_worker("damaged")
    spiders = spiders_of(prefix)
    text_dedup_count(state_client, spiders[1], "")
    result = crawl("forum", forum_seeds(), app=app).wait(timeout=60)
    assert forum_site.wait_idle(10)
    fetched = Counter(arrival.path for arrival in forum_site.arrivals())
    routed_count_repaired(Crawl(result, 1, state_client, spiders, fetched, worker.output()))
    assert worker.proc.poll() is None, "the worker died"


def test_a_routed_job_cancelled_past_a_damaged_routed_count_is_purged_whole(
    env: dict[str, str],
    app: Celery,
    start_worker: Callable[..., Worker],
    state_client: redis.Redis,
    forum_site: Any,
    prefix: str,
) -> None:
    """Issue 28, item 1: job_cancel.lua met the detail spider's count of text (taking the
    purged posts' fingerprints out of its filter) after it had marked the job cancelled
    and purged the forum spider's lists: the cancel failed half-done. Now the count is
    refused before the first write, moved aside with forum_detail, and the cancel sent
    again purges both spiders' queues whole."""
    env["SITE_RATE"] = "100"
    worker = start_worker("damaged")
    spiders = spiders_of(prefix)
    job = crawl("forum", forum_seeds(), app=app)
    deadline = time.monotonic() + 30
    while state_client.zcard(spiders[1].queue) == 0 or job.status().pages < DAMAGE_AFTER_PAGES:
        assert time.monotonic() < deadline, "no post was queued with forum_detail"
        time.sleep(0.02)
    text_dedup_count(state_client, spiders[1], job.id)
    assert job.cancel() > 0
    assert job.status().state == "cancelled"
    crawled = Crawl(None, 1, state_client, spiders, Counter(), "")
    routed_moved_aside(crawled, spiders[1].dupefilter_count)
    deadline = time.monotonic() + 30  # leased requests finish; nothing of the job stays queued
    while any(state_client.zcard(k.queue) or state_client.zcard(k.inflight) for k in spiders):
        assert time.monotonic() < deadline, "the cancelled job's requests stayed"
        time.sleep(0.2)
    assert forum_site.wait_idle(10)
    assert worker.proc.poll() is None, "the worker died"
    log = worker.output()
    assert not [line for line in log.splitlines() if any(e in line for e in ENGINE_ERRORS)]
