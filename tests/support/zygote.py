"""Test processes forked from a Python that has already imported Celery, Scrapy and Twisted.

Each worker process of the tests would otherwise spend about 1.3 s of CPU importing them, and
the integration tests start hundreds. The zygote (``python -m tests.support.zygote``) imports
the heavy packages once (the library too, but never the tests' apps and settings, which read
the environment on import, and never Twisted's reactor), then forks on request. A forked
child is the process ``python -m <module> <args>`` would be: its own session, the test's
environment, working folder and log, ``sys.argv`` and ``sys.path`` set as ``-m`` sets them,
and a normal interpreter exit (atexit handlers run). Only the imports are shared.

The protocol: one JSON line a request on a pipe, ``{"module", "args", "env", "cwd", "log",
"status"}``; the zygote answers the child's pid on another, and writes the child's exit
status (``Popen.returncode``'s convention) to the ``status`` file when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PRELOAD = [
    "billiard.pool",
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.concurrency.prefork",
    "celery.concurrency.solo",
    "celery.worker.consumer",
    "celery.backends.redis",
    "kombu.transport.redis",
    "crochet",
    "msgpack",
    "redis",
    "scrapy.crawler",
    "scrapy.core.engine",
    "scrapy.core.downloader.handlers.http11",
    "scrapy.spiders",
    "scrapy.settings.default_settings",
    "twisted.web.client",
    "typer",
    "tldextract",
    # the library itself (none of its modules reads the environment on import); never the
    # tests' apps and settings, which do
    "celery_crawl.app.client",
    "celery_crawl.app.tasks",
    "celery_crawl.app.worker",
    "celery_crawl.hosting.project",
    "celery_crawl.scheduler",
    "celery_crawl.tools.cli",
]


# The zygote's side ----------------------------------------------------------------------


def _exit_status(wait_status: int) -> int:
    """``Popen.returncode`` of a wait status: the exit code, or minus the signal."""
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _write_status(path: str, code: int) -> None:
    partial = f"{path}.part"
    Path(partial).write_text(str(code))
    os.replace(partial, path)


def _become(request: dict[str, Any], protocol_fds: tuple[int, int]) -> None:
    """In the forked child: become ``python -m module args`` (runs it, then exits)."""
    for fd in protocol_fds:
        os.close(fd)
    os.setsid()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at interpreter start
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)  # made empty by the tests' side
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # as -m sets it; the rest is the zygote's, the same
    sys.argv = [request["module"], *request["args"]]
    import runpy

    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)


def _reap(children: dict[int, str]) -> None:
    """Each ended child's exit status to its file."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        _write_status(children.pop(pid), _exit_status(status))


def _fork(request: dict[str, Any], requests: int, replies: int) -> int:
    assert threading.active_count() == 1, "the zygote must not fork with threads"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become(request, (requests, replies))  # never returns: SystemExit
    os.write(replies, f"{pid}\n".encode())
    return pid


def _serve(requests: int, replies: int) -> None:
    for name in PRELOAD:
        __import__(name)
    assert "twisted.internet.reactor" not in sys.modules, "a preload installed a reactor"
    children: dict[int, str] = {}
    buffer = b""
    while True:
        _reap(children)
        ready, _, _ = select.select([requests], [], [], 0.05)
        chunk = os.read(requests, 65536) if ready else None
        if chunk == b"":  # the tests are over: stop what is left
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            return
        buffer += chunk or b""
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            children[_fork(request, requests, replies)] = request["status"]


# The tests' side ------------------------------------------------------------------------


class Forked:
    """A child of the zygote, seen as ``subprocess.Popen`` sees its own."""

    def __init__(self, pid: int, status: Path, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._status = status

    def poll(self) -> int | None:
        if self.returncode is None and self._status.exists():
            self.returncode = int(self._status.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def startup(env: dict[str, str], cwd: Path) -> dict[str, object]:
    """What of an environment shapes the start of ``python -m`` in ``cwd``: ``PYTHONPATH``
    (its folders other than ``cwd``, which ``-m`` puts first anyway; a ``sitecustomize`` in
    one runs then) and every other ``PYTHON*`` variable. A child whose own differs from the
    zygote's is not one the zygote can fork."""
    values: dict[str, object] = {k: v for k, v in env.items() if k.startswith("PYTHON")}
    folders = values.pop("PYTHONPATH", "")
    assert isinstance(folders, str)
    values["PYTHONPATH"] = [p for p in folders.split(os.pathsep) if p and Path(p) != cwd]
    return values


class Zygote:
    """The tests' handle on one zygote process; ``spawn`` forks a child of it."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.startup = startup(env, cwd)
        self._to_zygote_r, self._to_zygote = os.pipe()
        self._from_zygote, self._from_zygote_w = os.pipe()
        fds = (self._to_zygote_r, self._from_zygote_w)
        command = [sys.executable, "-m", "tests.support.zygote", *map(str, fds)]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                command, cwd=cwd, env=env, pass_fds=fds, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        os.close(self._to_zygote_r)
        os.close(self._from_zygote_w)
        self._replies = os.fdopen(self._from_zygote, "rb")
        self._lock = threading.Lock()
        self._count = 0

    def spawn(
        self, module: str, args: list[str], env: dict[str, str], cwd: Path, log: Path
    ) -> Forked:
        with self._lock:
            self._count += 1
            status = log.with_name(f"{log.name}.{os.getpid()}-{self._count}.exit")
            status.unlink(missing_ok=True)
            log.write_bytes(b"")  # there when this returns, as Popen's output file is
            request = {
                "module": module, "args": args, "env": env, "cwd": str(cwd),
                "log": str(log), "status": str(status),
            }  # fmt: skip
            os.write(self._to_zygote, json.dumps(request).encode() + b"\n")
            ready, _, _ = select.select([self._replies], [], [], 30)
            if not ready:
                raise RuntimeError(f"the zygote did not fork (exit {self.proc.poll()})")
            pid = int(self._replies.readline())
        return Forked(pid, status, [module, *args])

    def close(self) -> None:
        os.close(self._to_zygote)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._replies.close()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
