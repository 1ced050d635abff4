"""Fixtures of the high-availability tests: a cluster, a sentinel set, their TLS variants."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ha_servers import (
    ReplicatedCluster,
    SentinelSet,
    Server,
    Tls,
    start_cluster,
    stop_all,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    nodes = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield nodes
    stop_all(nodes)


@pytest.fixture
def sentinel_set(tmp_path: Path) -> Iterator[SentinelSet]:
    servers = SentinelSet(tmp_path / "sentinel")
    yield servers
    servers.stop()


@pytest.fixture
def tls_sentinel_set(tmp_path: Path, tls: Tls) -> Iterator[SentinelSet]:
    """The sentinel set of Debian's redis-server, TLS only."""
    servers = SentinelSet(tmp_path / "tls-sentinel", tls=tls)
    yield servers
    servers.stop()


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[SentinelSet]:
    """A master and a replica, no sentinels."""
    servers = SentinelSet(tmp_path / "replicated", sentinels=0)
    yield servers
    servers.stop()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return Tls.make(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory, tls: Tls) -> Iterator[list[Server]]:
    """Three masters of Debian's redis-server that speak only TLS."""
    nodes = start_cluster(tmp_path_factory.mktemp("tls-cluster"), tls=tls)
    yield nodes
    stop_all(nodes)


@pytest.fixture
def replicated_cluster(tmp_path: Path) -> Iterator[ReplicatedCluster]:
    """Three masters with a replica each; a dead master's replica takes over in seconds."""
    servers = ReplicatedCluster(tmp_path / "replicated-cluster")
    yield servers
    servers.stop()
