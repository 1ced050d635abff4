"""Test processes forked from a Python that has already imported Celery, Scrapy and Twisted.

Each worker process of the tests would otherwise spend about 1.3 s of CPU importing them, and
the integration tests start hundreds. The zygote (``python -m tests.support.zygote``) imports
the heavy packages once, with every module a worker would import on its first crawl (the
library's, and those of the components Scrapy's defaults name), but never the tests' apps and
settings, which read the environment on import, and never Twisted's reactor. Then it freezes
its heap out of the garbage collector's reach, as ``gc.freeze``'s documentation advises
before a fork, and forks on request. A forked child is the process ``python -m <module>
<args>`` (or ``python <script> <args>``) would be: its own session, the test's environment,
working folder and output, ``sys.argv`` and ``sys.path`` set as the interpreter sets them,
the module run anew as ``__main__`` even if preloaded, an uncaught exception's traceback and
exit 1, and a normal interpreter exit (atexit handlers run). What differs: the imports are
done already and frozen, a script's globals are freed as it returns (``runpy.run_path``),
not at interpreter shutdown (a test of what happens at shutdown starts a new interpreter),
the hash seed is the zygote's, the parent is the zygote, and ``/proc/PID/cmdline`` names the
zygote, so a test that looks a process up by its command line must start it as a new
interpreter. A child whose start would differ (its ``PYTHON*`` variables, a
``sitecustomize``, the locale, its first ``sys.path`` folder: :func:`startup`) is started
as a new interpreter anyway. If the zygote dies, a child's exit
is unknown and polling it raises; the next start makes a new zygote.

The protocol: one JSON line a request on a pipe, ``{"module", "args", "env", "cwd", "log",
"errors", "status", "script"}`` (``errors`` empty: the error output goes to ``log`` too;
``script`` set: that file is run, as ``python <script>`` runs it, not ``module``); the zygote
answers the child's pid on another, and writes the child's exit status
(``Popen.returncode``'s convention) to the ``status`` file when it ends.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
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
    # what a worker imports once it runs: its consumer's parts, the prefork pool's children
    "billiard.popen_fork",
    "billiard.sharedctypes",
    "billiard.synchronize",
    "celery.app.control",
    "celery.app.events",
    "celery.app.log",
    "celery.worker.autoscale",
    "celery.worker.components",
    "celery.worker.consumer.delayed_delivery",
    "celery.worker.strategy",
    "kombu.pidbox",
]


def _library_modules() -> list[str]:
    """Every module of the library but the demo's (its app and settings read the
    environment on import): a crawler loads its middlewares, stats and feeds by name."""
    import pkgutil

    import celery_crawl

    found = pkgutil.walk_packages(celery_crawl.__path__, "celery_crawl.")
    return [module.name for module in found if not module.name.startswith("celery_crawl.demo")]


def _scrapy_components() -> list[str]:
    """The modules of the classes Scrapy's default settings name (extensions, middlewares,
    download handlers, exporters, stats...): each crawler loads them by name, and the first
    one in a process imports them (aiohttp and pydantic among them) for about 0.1 s of CPU."""
    from scrapy.settings import default_settings

    names: set[str] = set()
    for value in vars(default_settings).values():
        candidates = [*value, *value.values()] if isinstance(value, dict) else [value]
        names.update(
            name.rsplit(".", 1)[0]
            for name in candidates
            if isinstance(name, str) and name.startswith("scrapy.")
        )
    return sorted(names)


def _preload() -> None:
    for name in [*PRELOAD, *_library_modules(), *_scrapy_components()]:
        __import__(name)
    assert "twisted.internet.reactor" not in sys.modules, "a preload installed a reactor"
    # each child's collections (the first, full one in freeze_startup_heap among them) then
    # skip what it inherits
    gc.collect()
    gc.freeze()


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


def _become(request: dict[str, Any], protocol_fds: tuple[int, ...], ready: int) -> None:
    """In the forked child: become ``python -m module args``, or ``python script args``
    (runs it, then exits; never returns into the zygote's loop, whatever it raises)."""
    for fd in protocol_fds:
        os.close(fd)
    os.setsid()
    os.write(ready, b"1")  # in a session of its own before the tests learn its pid
    os.close(ready)
    # as at interpreter start (the zygote ignores SIGINT; SIGPIPE stays ignored, as Python's
    # start leaves it)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # made empty by the tests' side; the error output to its own file when one is named
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
    errors = os.open(request["errors"], os.O_WRONLY | os.O_APPEND) if request.get("errors") else log
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(errors, 2)
    for fd in {log, errors, null}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    try:
        _run(request)
    except SystemExit:
        raise  # its exit code: the interpreter's normal exit (atexit handlers run)
    except KeyboardInterrupt:  # as an interpreter does: the traceback, then death by SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # as an interpreter does: the traceback, exit 1
        traceback.print_exc()
        sys.exit(1)
    sys.exit(0)


def _run(request: dict[str, Any]) -> None:
    import runpy

    if request.get("script"):  # python <script>: its folder first, as the interpreter sets it
        sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
        sys.argv = [request["script"], *request["args"]]
        runpy.run_path(request["script"], run_name="__main__")
    else:
        sys.path[0] = request["cwd"]  # as -m sets it; the rest is the zygote's, the same
        sys.argv = [request["module"], *request["args"]]
        # a preloaded module (the command line's) runs anew as __main__, as in a fresh
        # interpreter, where it is not imported first (runpy warns of one that is); a
        # package stays, its __main__ is what runs
        preloaded = sys.modules.get(request["module"])
        if preloaded is not None and not hasattr(preloaded, "__path__"):
            del sys.modules[request["module"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def _reap(children: dict[int, str]) -> None:
    """Each ended child's exit status to its file."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        try:
            _write_status(children.pop(pid), _exit_status(status))
        except OSError as exc:  # its folder gone: the test that made it has ended
            print(f"zygote: exit status of {pid} not written: {exc!r}", file=sys.stderr)


def _fork(request: dict[str, Any], requests: int, replies: int) -> int:
    assert threading.active_count() == 1, "the zygote must not fork with threads"
    sys.stdout.flush()
    sys.stderr.flush()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        _become(request, (requests, replies), ready_w)  # never returns: SystemExit
    os.close(ready_w)
    os.read(ready_r, 1)  # its session made (or it died first: end of file)
    os.close(ready_r)
    return pid


def _serve(requests: int, replies: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ctrl-C of the tests is theirs to handle
    _preload()
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
            try:
                request = json.loads(line)
                status = str(request["status"])
                pid = _fork(request, requests, replies)
            except Exception as exc:
                print(f"zygote: request refused: {exc!r}", file=sys.stderr, flush=True)
                _write_all(replies, b"0\n")
                continue
            children[pid] = status
            _write_all(replies, f"{pid}\n".encode())


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


# The tests' side ------------------------------------------------------------------------

STARTUP = {
    "LANG",
    "LANGUAGE",
    "TZ",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    # read on import by modules the zygote imports
    "AIOHTTP_NO_EXTENSIONS",
    "AIOHTTP_NOSENDFILE",
    "YARL_NO_EXTENSIONS",
    "MULTIDICT_NO_EXTENSIONS",
    "PROPCACHE_NO_EXTENSIONS",
    "PROMETHEUS_MULTIPROC_DIR",
    "MP_LOG",
    "AUTOSCALE_KEEPALIVE",
}


class Forked:
    """A child of the zygote, seen as ``subprocess.Popen`` sees its own."""

    def __init__(self, pid: int, status: Path, args: list[str], zygote: Zygote) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._status = status
        self._zygote = zygote

    def poll(self) -> int | None:
        if self.returncode is None and self._status.exists():
            self.returncode = int(self._status.read_text())
        if self.returncode is None and not self._zygote.alive() and not self._status.exists():
            raise RuntimeError(f"the zygote died: the exit of {self.args} is unknown")
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
    one runs then), every other ``PYTHON*`` variable, the locale and :data:`STARTUP`. A
    child whose own differs from the zygote's is not one the zygote can fork."""
    values: dict[str, object] = {
        k: v for k, v in env.items() if k.startswith(("PYTHON", "LC_")) or k in STARTUP
    }
    folders = values.pop("PYTHONPATH", "")
    assert isinstance(folders, str)
    values["PYTHONPATH"] = [p for p in folders.split(os.pathsep) if p and Path(p) != cwd]
    return values


class Zygote:
    """The tests' handle on one zygote process; ``spawn`` forks a child of it."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log
        self._to_zygote_r, self._to_zygote = os.pipe()
        self._from_zygote, self._from_zygote_w = os.pipe()
        fds = (self._to_zygote_r, self._from_zygote_w)
        command = [sys.executable, "-m", "tests.support.zygote", *map(str, fds)]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                command, cwd=cwd, env=env, pass_fds=fds, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        os.close(self._to_zygote_r)
        os.close(self._from_zygote_w)
        self._replies = os.fdopen(self._from_zygote, "rb")
        self._lock = threading.Lock()
        self._count = 0

    def spawn(
        self,
        module: str,
        args: list[str],
        env: dict[str, str],
        cwd: Path,
        log: Path,
        errors: Path | None = None,
        script: Path | None = None,
    ) -> Forked:
        """``python -m module args`` (``python script args`` with ``script``), its output to
        ``log``, and its error output too unless ``errors`` names a file of its own."""
        with self._lock:
            self._count += 1
            status = log.with_name(f"{log.name}.{os.getpid()}-{self._count}.exit")
            status.unlink(missing_ok=True)
            for output in (log, errors):  # there when this returns, as Popen's output file is
                if output is not None:
                    output.write_bytes(b"")
            request = {
                "module": module, "args": args, "env": env, "cwd": str(cwd),
                "log": str(log), "errors": str(errors or ""), "status": str(status),
                "script": str(script or ""),
            }  # fmt: skip
            _write_all(self._to_zygote, json.dumps(request).encode() + b"\n")
            ready, _, _ = select.select([self._replies], [], [], 30)
            if not ready:  # its answer may still come: this zygote is of no more use
                self.proc.kill()
                raise RuntimeError(f"the zygote did not fork (exit {self.proc.poll()})")
            pid = int(self._replies.readline() or 0)
        if pid == 0:
            raise RuntimeError(f"the zygote could not fork {script or module} (see {self.log})")
        return Forked(pid, status, [str(script or module), *args], self)

    def fits(self, env: dict[str, str], folder: Path) -> bool:
        """Whether a child started with ``env`` whose ``sys.path`` starts with ``folder``
        (the working folder of ``-m``, a script's folder) would start as this zygote did."""
        return startup(env, folder) == startup(self.env, folder)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        os.close(self._to_zygote)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._replies.close()
        if self.proc.returncode == 0:  # its log kept when it failed
            shutil.rmtree(self.log.parent, ignore_errors=True)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
