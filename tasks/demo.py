"""``celery-crawl demo``: the whole system on one machine, in one command.

It starts an embedded Valkey when ``REDIS_URL`` is not set, the demo forum
site, a Celery worker hosting the crawlers, Celery beat running the
producer, and Flower on localhost with a generated password. Then it shows
live progress until Ctrl-C, or, with ``--once``, until the first round of
jobs is done, and prints a summary.

The Celery processes run with a temporary folder as their working directory,
so ``-A tasks`` always finds this example, never a ``tasks.py`` of the folder
the demo was started from. ``celery-crawl demo`` is this module's command,
added through the ``celery_crawl.commands`` entry points.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
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

from celery_crawl import connection
from celery_crawl.embedded import redis_url
from celery_crawl.exporter import read
from celery_crawl.keys import SpiderKeys
from tasks.site import SiteConfig, SiteThread, run_in_thread


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
        command = [sys.executable, "-m", "celery", "-A", "tasks", *args]
        self.procs[name] = subprocess.Popen(
            command,
            cwd=self.logs,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def check(self) -> None:
        for name, proc in self.procs.items():
            finished = proc.poll() is not None
            if finished and not (name == "kick" and proc.returncode == 0):
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class Progress:
    """What the demo shows, read from the site and Redis."""

    started: float = field(default_factory=time.monotonic)
    jobs: set[str] = field(default_factory=set)
    last_pages: int = 0
    last_time: float = field(default_factory=time.monotonic)

    def read(
        self, client: redis.Redis, group: list[SpiderKeys], site: SiteThread
    ) -> dict[str, Any]:
        """``group``: the producing spider's keys first, then the other spiders of its jobs."""
        keys = group[0]
        running: dict[bytes, bytes] = client.hgetall(keys.producer_running)  # type: ignore[assignment]
        self.jobs |= {v.decode().split("|")[0] for v in running.values()}
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
        return {
            "jobs": len(self.jobs),
            "jobs done": sum(s in (b"done", b"failed", b"cancelled") for s in states),
            "pages": pages,
            "pages/s": round(rate, 1),
            "items": sum(int(items or 0) for _, items in jobs),
            "queue": sum(reading.queued for reading in readings),
            "held back": stats.get("producer/held_back", 0),
            "errors": sum(int(v) for k, v in stats.items() if k.startswith("log_count/ERROR")),
        }


def render(values: dict[str, Any]) -> Table:
    table = Table(title="celery_crawl demo", show_header=False)
    for name, value in values.items():
        table.add_row(name, str(value))
    return table


@contextmanager
def services(
    forums: int, logs: Path, items: Path
) -> Iterator[tuple[Services, SiteThread, str, str]]:
    with ExitStack() as stack:
        url = stack.enter_context(redis_url())
        site = stack.enter_context(run_in_thread(SiteConfig(forums=forums)))
        password = secrets.token_urlsafe(12)
        env = {
            **os.environ,
            "REDIS_URL": url,
            "FORUM_BASE_URL": site.url,
            "FORUM_FEED": str(items / "%(job)s" / "%(name)s-%(worker)s.jsonl"),
            "PRODUCER_SOURCES": ",".join(SiteConfig(forums=forums).forum_ids()),
        }
        running = Services(logs, env)
        stack.callback(running.stop)
        port = free_port()
        running.start("worker", "worker", "--loglevel", "INFO", "--concurrency", "2")
        running.start("beat", "beat", "--loglevel", "INFO", "--schedule", str(logs / "beat"))
        running.start(
            "flower",
            "flower",
            "--address=127.0.0.1",
            f"--port={port}",
            f"--basic-auth=admin:{password}",
        )
        # beat's first tick comes one period after it starts: produce once right away
        running.start("kick", "call", "celery_crawl.produce", "--args", '["forum"]')
        yield running, site, url, f"http://127.0.0.1:{port} (user admin, password {password})"


def run(forums: int = 3, once: bool = False, items_dir: str = "items") -> int:
    console = Console()
    logs = Path(tempfile.mkdtemp(prefix="celery-crawl-demo-"))
    items = Path(items_dir).resolve()
    items.mkdir(exist_ok=True)
    with services(forums, logs, items) as (running, site, url, flower):
        console.print(f"Redis {url}\nforum site {site.url}\nFlower {flower}\nlogs {logs}")
        client, progress = connection.get_redis(url), Progress()
        keys = [SpiderKeys.build(name, group="forum") for name in ("forum", "forum_detail")]
        try:
            with Live(render({}), console=console, refresh_per_second=2) as live:
                while True:
                    running.check()
                    values = progress.read(client, keys, site)
                    live.update(render(values))
                    if once and values["jobs"] >= forums and values["jobs done"] == values["jobs"]:
                        break
                    time.sleep(0.5)
        except KeyboardInterrupt:
            console.print("stopping...")
            return 0
    summary = {
        **values,
        "duration s": round(time.monotonic() - progress.started, 1),
        "items in": str(items),
    }
    console.print(render(summary))
    return 0


command = typer.Typer(add_completion=False)


@command.command()
def demo(
    once: Annotated[bool, typer.Option("--once", help="exit after the first round")] = False,
    forums: Annotated[int, typer.Option(help="forums on the demo site")] = 3,
    items: Annotated[str, typer.Option(help="folder for the item files")] = "items",
) -> None:
    """Run everything locally: Redis, demo site, worker, beat, Flower, live progress."""
    raise typer.Exit(run(forums=forums, once=once, items_dir=items))


if __name__ == "__main__":
    command()
