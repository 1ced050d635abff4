"""Real Celery worker processes for the tests, started and stopped with bounded waits."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from celery import Celery

from tests.support import ROOT
from tests.support.zygote import Forked, Zygote

Process = subprocess.Popen[bytes] | Forked

WORKER_APP = "tests.support.worker_app"
WORKER_SETTINGS = "tests.support.worker_settings"


class Worker:
    """``celery -A <app> worker`` (the test worker app by default) in its own process group."""

    def __init__(
        self,
        name: str,
        env: dict[str, str],
        log: Path,
        pool: str = "prefork",
        concurrency: int = 2,
        queues: str | None = None,
        app: str = WORKER_APP,
    ) -> None:
        self.name = name
        self.log = log
        args = [
            "-A",
            app,
            "worker",
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "--hostname",
            f"{name}@%h",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            *(["--queues", queues] if queues else []),
        ]
        self.proc = start_process("celery", args, env, log)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text() if self.log.exists() else ""
            if " ready." in text:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{text[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.name} not ready:\n{self.log.read_text()[-3000:]}")

    def wait_answering(self, app: Celery, timeout: float = 60) -> None:
        """Until the main process answers a control ping: it is connected and consuming again.

        A log line cannot tell this: a connection lost while the consumer starts is taken up
        again by kombu without a second "Connected to" line.
        """
        node = f"{self.name}@{socket.gethostname()}"
        away = app.connection_for_write().connection_errors  # no connection is made
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(*away):
                if app.control.ping(destination=[node], timeout=0.5):
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.output()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.name} does not answer:\n{self.output()[-3000:]}")

    def signal(self, signum: int) -> None:
        os.killpg(self.proc.pid, signum)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.wait(0)

    def output(self) -> str:
        return self.log.read_text()


def start_process(module: str, args: list[str], env: dict[str, str], log: Path) -> Process:
    """``python -m module args`` in a session of its own, its output to ``log``: forked from
    the zygote (Celery, Scrapy and Twisted imported once), or with ``CELERY_CRAWL_TEST_ZYGOTE=0``
    started as a new interpreter (so is one whose ``PYTHON*`` variables are not the zygote's)."""
    zygote = _zygote_fitting(env, ROOT)
    if zygote is None:  # the zygote off, or a sitecustomize of its own, say
        command = [sys.executable, "-m", module, *args]
        with log.open("w") as out:
            return subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
    return zygote.spawn(module, args, env, ROOT, log)


def run_module(
    module: str,
    args: list[str],
    env: dict[str, str],
    timeout: float,
    cwd: Path = ROOT,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` run to its end, as ``subprocess.run`` with
    ``capture_output=True, text=True`` runs it (its output and error output apart, a
    ``TimeoutExpired`` after ``timeout`` with what it wrote, ``CalledProcessError`` with
    ``check``), forked from the zygote as :func:`start_process` does: a command line tool's
    run costs no import."""
    done = _run(args, env, timeout, cwd, cwd, module=module)
    if check:
        done.check_returncode()
    return done


def run_script(
    script: Path, env: dict[str, str], timeout: float, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """``python script`` run to its end in ``cwd``, as :func:`run_module` runs a module."""
    folder = script.resolve().parent  # first on its sys.path
    return _run([], env, timeout, cwd, folder, script=script)


def _run(
    args: list[str],
    env: dict[str, str],
    timeout: float,
    cwd: Path,
    first: Path,
    module: str = "",
    script: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` or ``python script args``, forked from the zygote when a
    child whose ``sys.path`` starts with ``first`` would start there as it does in a new
    interpreter; else run as one."""
    command = [sys.executable, *([str(script)] if script else ["-m", module]), *args]
    zygote = _zygote_fitting(env, first)
    if zygote is None:
        return subprocess.run(
            command, check=False, cwd=cwd, env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="celery-crawl-run-") as folder:
        out, err = Path(folder) / "out", Path(folder) / "err"
        child = zygote.spawn(module, args, env, cwd, out, errors=err, script=script)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)  # its session: what it started too
            with contextlib.suppress(subprocess.TimeoutExpired, RuntimeError):
                child.wait(10)
            raise subprocess.TimeoutExpired(
                command, timeout, out.read_text(), err.read_text()
            ) from None
        return subprocess.CompletedProcess(command, code, out.read_text(), err.read_text())


def _zygote_fitting(env: dict[str, str], first: Path) -> Zygote | None:
    """The zygote, if it is on (``CELERY_CRAWL_TEST_ZYGOTE`` is not ``0``) and a child
    with ``env`` whose ``sys.path`` starts with ``first`` would start there as it does in
    a new interpreter (:meth:`Zygote.fits`); else None."""
    if os.environ.get("CELERY_CRAWL_TEST_ZYGOTE", "1") == "0":
        return None
    zygote = _zygote()
    return zygote if zygote.fits(env, first) else None


_zygotes: list[Zygote] = []
_zygote_lock = threading.Lock()


def _zygote() -> Zygote:
    """This process's zygote, started on first use, and again if it has died."""
    with _zygote_lock:
        if not _zygotes or not _zygotes[-1].alive():
            folder = Path(tempfile.mkdtemp(prefix="celery-crawl-zygote-"))
            path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
            zygote = Zygote(ROOT, {**os.environ, "PYTHONPATH": path}, folder / "zygote.log")
            atexit.register(zygote.close)
            _zygotes.append(zygote)
        return _zygotes[-1]


def worker_env(redis_url: str, prefix: str, site_url: str, feed_dir: Path) -> dict[str, Any]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "REDIS_URL": redis_url,
        "CELERY_CRAWL_KEY_PREFIX": prefix,
        "FORUM_BASE_URL": site_url,
        "FORUM_FEED": str(feed_dir / "%(name)s-%(pid)s.jsonl"),
        "PYTHONPATH": path,
    }


@contextlib.contextmanager
def killed_at_end() -> Iterator[list[Any]]:
    """A list for the processes a test starts; each still running at the end (the test
    failed midway, or timed out) is killed."""
    procs: list[Any] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@contextlib.contextmanager
def started_workers(env: dict[str, str], folder: Path) -> Iterator[Callable[..., Worker]]:
    """``start(name, pool, concurrency, queues, app, extra_env)`` starts a ready worker, with
    ``extra_env`` over ``env``; all stop on exit."""
    started: list[Worker] = []

    def start(
        name: str = "w1",
        pool: str = "prefork",
        concurrency: int = 2,
        queues: str | None = None,
        app: str = WORKER_APP,
        extra_env: dict[str, str] | None = None,
    ) -> Worker:
        environment = {**env, **(extra_env or {})}
        log = folder / f"{name}.log"
        worker = Worker(name, environment, log, pool, concurrency, queues, app)
        started.append(worker)
        worker.wait_ready()
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()
