"""Ordinary Scrapy spiders on the shared queue, with all their state on the local Redis Cluster.

The same tests as in ``tests/integration`` (spider kinds, scrapy-redis examples, several
processes, dropped requests, shared cookies), collected here a second time with
``redis_url`` pointing at a three-master cluster. Celery's broker and results stay on the
plain server (a cluster cannot be a broker), as in a real deployment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import app, start_worker, state_client
from tests.integration.test_drops import (
    test_a_job_whose_callback_yields_an_unqueueable_request_ends_incomplete,
)
from tests.integration.test_scrapy_redis_examples import (
    test_dmoz_crawlspider_runs_on_the_shared_queue,
    test_mycrawler_redis_follows_every_link_from_a_start_url,
    test_myspider_redis_reads_urls_and_json_from_the_start_key,
)
from tests.integration.test_shared_cookies import (
    test_a_hosted_jobs_login_serves_both_worker_processes_and_no_other_job,
    test_a_login_in_one_process_serves_the_other,
)
from tests.integration.test_shared_queue import (
    crawl,
    site,
    test_a_process_started_while_the_queue_is_empty_waits_and_crawls,
    test_without_persist_the_dedup_set_lives_until_the_last_process_closes,
)
from tests.integration.test_spider_kinds import (
    test_a_hosted_crawl_spider_runs_a_job_to_done,
    test_two_processes_crawl_the_whole_site_once,
)
from tests.support.failover import ha_app
from tests.support.ha_servers import Server, cluster_url

__all__ = [  # collected again here, with the fixtures below
    "app",
    "crawl",
    "site",
    "start_worker",
    "state_client",
    "test_a_hosted_crawl_spider_runs_a_job_to_done",
    "test_a_hosted_jobs_login_serves_both_worker_processes_and_no_other_job",
    "test_a_job_whose_callback_yields_an_unqueueable_request_ends_incomplete",
    "test_a_login_in_one_process_serves_the_other",
    "test_a_process_started_while_the_queue_is_empty_waits_and_crawls",
    "test_dmoz_crawlspider_runs_on_the_shared_queue",
    "test_mycrawler_redis_follows_every_link_from_a_start_url",
    "test_myspider_redis_reads_urls_and_json_from_the_start_key",
    "test_two_processes_crawl_the_whole_site_once",
    "test_without_persist_the_dedup_set_lives_until_the_last_process_closes",
]


@pytest.fixture
def redis_url(cluster: list[Server]) -> str:
    """Crawl state on the cluster: every test above passes this URL to its processes."""
    return cluster_url(cluster)


@pytest.fixture
def env(
    redis_url: str,
    db_url: str,
    prefix: str,
    sites: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, Any]:
    """Workers keep crawl state on the cluster, and Celery on a database of the plain server."""
    _, values = ha_app(redis_url, db_url, sites, prefix, tmp_path, monkeypatch)
    return values


def test_the_state_of_these_tests_is_on_the_cluster(
    redis_url: str, state_client: Any, env: dict[str, Any]
) -> None:
    """What makes the tests above cluster tests: their URL and clients reach the cluster."""
    from redis.cluster import RedisCluster

    assert redis_url.startswith("redis+cluster://") and env["REDIS_URL"] == redis_url
    assert isinstance(state_client, RedisCluster)
    assert len(state_client.get_primaries()) == 3
    assert not env["CELERY_BROKER_URL"].startswith("redis+cluster")
