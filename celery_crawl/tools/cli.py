"""The ``celery-crawl`` command line (its help: :data:`HELP`).

    celery-crawl crawl SPIDER SEED... --app APP [--priority N] [--wait] [--json]
    celery-crawl status --app APP [--watch] [--json]   # the crawl at a glance
    celery-crawl dedup SPIDER --app APP [--reset]      # a spider's dedup filter
    celery-crawl sources add|list|show|pause|resume|remove|import|export ...
                                                       # sources on their own schedules
    celery-crawl exporter --app APP [--port 9410]      # Prometheus metrics
    celery-crawl demo                                  # the bundled example, all of it

APP is your Celery app, as in ``celery -A``: ``--app myproject.celery``,
or the environment variable ``CELERY_CRAWL_APP``. Each SEED starts one
job. A seed is JSON (``'{"forum_id": "00001"}'``) or a bare value for
the spider's ``seed_key``.

Installed packages add commands through the ``celery_crawl.commands``
entry-point group; the bundled example adds ``demo`` and ``site``.
"""

from __future__ import annotations

import functools
import json
import sys
import time
import uuid
from importlib.metadata import EntryPoint, entry_points
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup
from typer.main import get_command as click_command_of

from celery_crawl.core.errors import CeleryCrawlError, quote
from celery_crawl.jobs.limits import describe as describe_limits
from celery_crawl.tools import sources_cli
from celery_crawl.tools.app_option import APP_ENVVAR, AppOption, err, load_app, open_app

PLUGIN_GROUP = "celery_crawl.commands"
__all__ = ["APP_ENVVAR", "AppOption", "cli", "err", "load_app", "main", "open_app"]


@functools.cache
def plugins() -> dict[str, EntryPoint]:
    """The commands installed packages add, by name (the first of a name wins)."""
    found: dict[str, EntryPoint] = {}
    for entry_point in entry_points(group=PLUGIN_GROUP):
        found.setdefault(entry_point.name, entry_point)
    return found


@functools.cache
def load_plugin(name: str) -> Any:
    """The command of the Typer app the entry point ``name`` names, or None.

    A Typer app of one command gives that command; of several, a group of
    them. A plugin that cannot be loaded costs one warning line on stderr,
    not the whole command line.
    """
    entry_point = plugins()[name]
    try:
        target = entry_point.load()
        if not isinstance(target, typer.Typer):
            raise TypeError(f"a {type(target).__name__}, not a typer.Typer")
        return click_command_of(target)
    except Exception as exc:  # whatever the plugin's fault: warn, go on without it
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(
            f"warning: command {name!r} ({entry_point.value}) not loaded: {reason}", file=sys.stderr
        )
        return None


class PluginGroup(TyperGroup):
    """The built-in commands, then those of the ``celery_crawl.commands`` entry points.

    A plugin is imported only when its command runs or ``--help`` lists it.
    """

    # contexts and commands are click's, or typer's own copy of click: Any for both
    def list_commands(self, ctx: Any) -> list[str]:
        builtin = super().list_commands(ctx)
        return builtin + sorted(name for name in plugins() if name not in builtin)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in plugins():
            command = load_plugin(cmd_name)
        return command


HELP = f"""Scrapy crawls on Celery workers that share one Redis queue.

New here? celery-crawl demo runs everything on this machine (Ctrl-C stops it).

The other commands need your Celery app: --app/-A, as in celery -A (--app
myproject.celery; --app celery_crawl.demo for the bundled example), or
{APP_ENVVAR}. They reach the crawl state in the Redis at REDIS_URL (default
redis://localhost:6379/0).

Examples:

  celery-crawl crawl -A celery_crawl.demo forum 00001 --wait

  celery-crawl status -A celery_crawl.demo --watch

Installed packages add commands through the {PLUGIN_GROUP} entry-point group;
the bundled example adds demo and site."""

cli = typer.Typer(add_completion=False, help=HELP, cls=PluginGroup, invoke_without_command=True)


@cli.callback()
def root(ctx: typer.Context) -> None:
    """Alone, ``celery-crawl`` shows the help (and succeeds)."""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


@cli.command()
def crawl(
    spider: Annotated[str, typer.Argument(help="spider name")],
    seeds: Annotated[
        list[str] | None,
        typer.Argument(help="one job per seed; none: one job of the spider's start requests"),
    ] = None,
    *,
    priority: Annotated[int, typer.Option(help="job priority, added to every request")] = 0,
    wait: Annotated[
        bool, typer.Option("--wait", help="show progress until every job is done")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
    app: AppOption = None,
    timeout: Annotated[float, typer.Option(help="seconds --wait waits at most")] = 3600.0,
    limit: Annotated[
        list[str] | None,
        typer.Option(
            "--limit",
            help=f"a job limit, NAME=NUMBER (repeatable): {describe_limits()}",
        ),
    ] = None,
    argument: Annotated[
        list[str] | None,
        typer.Option(
            "-a",
            "--arg",
            help="a spider argument of the job, NAME=VALUE, as `scrapy crawl -a` (repeatable)",
        ),
    ] = None,
) -> None:
    """Start crawl jobs; with --wait, follow them until they are done."""
    from celery_crawl.hosting.project import project_of
    from celery_crawl.hosting.registry import Registry

    celery_app = open_app(app)
    try:
        jobs = start_jobs(
            celery_app,
            spider,
            seeds or [],
            priority=priority,
            limit=limit or [],
            arg=argument or [],
        )
    except (CeleryCrawlError, ValueError) as exc:  # unknown spider, bad seed or limit, no Redis
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    if not wait:
        ids = [job.id for job in jobs]
        typer.echo(json.dumps({"jobs": ids}) if as_json else "\n".join(ids))
        return
    registry = Registry.from_settings(project_of(celery_app).settings)
    results = follow(jobs, timeout, quiet=as_json, registry=registry)
    if as_json:
        typer.echo(json.dumps(results, indent=2))
    raise typer.Exit(0 if all(r["state"] == "done" for r in results) else 1)


def start_jobs(
    celery_app: Any,
    spider: str,
    seeds: list[str],
    *,
    priority: int,
    limit: list[str],
    arg: list[str],
) -> list[Any]:
    """A job per seed (none: one of the start requests), every job's input checked first."""
    from celery_crawl import crawl as start
    from celery_crawl.hosting.project import parse_seed, project_of
    from celery_crawl.jobs.inputs import check_job

    spidercls = project_of(celery_app).spider_class(spider)
    limits, args = parse_limits(limit), parse_args(arg)
    per_job = [[parse_seed(spidercls, s)] for s in seeds] if seeds else [[]]
    planned = [(uuid.uuid4().hex, job_seeds) for job_seeds in per_job]
    for job_id, job_seeds in planned:  # so that a bad seed starts no job at all
        check_job(spider, job_seeds, priority=priority, job_id=job_id, limits=limits, args=args)
    return [
        start(spider, job_seeds, priority, app=celery_app, job_id=job_id, limits=limits, args=args)
        for job_id, job_seeds in planned
    ]


def parse_limits(texts: list[str]) -> dict[str, float]:
    """``["pages=50", "seconds=600"]`` -> ``{"pages": 50.0, "seconds": 600.0}``."""
    from celery_crawl.jobs.limits import LIMITS

    limits = {}
    for text in texts:
        name, _, value = text.partition("=")
        if name not in LIMITS:
            raise ValueError(f"--limit {quote(text)}: the limits are {', '.join(LIMITS)}")
        try:
            limits[name] = float(value)
        except ValueError:
            raise ValueError(f"--limit {quote(text)}: {quote(value)} is not a number") from None
    return limits


def parse_args(texts: list[str]) -> dict[str, str]:
    """``["category=news"]`` -> ``{"category": "news"}``, as ``scrapy crawl -a`` reads them."""
    args = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep:
            raise ValueError(f"-a {quote(text)}: a spider argument is NAME=VALUE")
        args[name] = value
    return args


def spider_keys(celery_app: Any) -> tuple[Any, list[Any]]:
    """The Redis client and the keys of every spider of the app's project."""
    from celery_crawl.hosting.project import project_of

    project = project_of(celery_app)
    return project.client, [project.keys(name) for name in project.spider_names()]


@cli.command()
def status(
    app: AppOption = None,
    watch: Annotated[bool, typer.Option("--watch", help="refresh until Ctrl-C")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
    interval: Annotated[float, typer.Option(help="seconds between refreshes")] = 2.0,
    svg: Annotated[str | None, typer.Option(help="also save the screen as an SVG file")] = None,
) -> None:
    """Per spider: queue, in flight, dedup, pages/s, items/s, running jobs; workers online."""
    from rich.live import Live

    from celery_crawl.tools.status import render, snapshot

    celery_app = open_app(app)
    client, spiders = spider_keys(celery_app)
    if as_json:
        typer.echo(json.dumps(snapshot(client, spiders, celery_app), indent=2))
        return
    console = Console(record=svg is not None)
    if not watch:
        console.print(render(snapshot(client, spiders, celery_app)))
        if svg is not None:
            console.save_svg(svg, title="celery-crawl status")
        return
    with Live(console=console, refresh_per_second=1) as live:
        try:
            while True:
                live.update(render(snapshot(client, spiders, celery_app)))
                time.sleep(interval)
        except KeyboardInterrupt:
            return


@cli.command()
def dedup(
    spider: Annotated[str, typer.Argument(help="spider name")],
    app: AppOption = None,
    reset: Annotated[
        bool, typer.Option("--reset", help="forget every fingerprint: later jobs crawl again")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
) -> None:
    """Show a spider's shared dedup filter (kind, fingerprints, memory); --reset clears it."""
    from celery_crawl.hosting.project import project_of

    try:
        project = project_of(open_app(app))
        df = project.dupefilter(spider)
        scope = project.dedup_scope(spider)
        before = {"spider": spider, "scope": scope, "kind": df.kind, "fingerprints": len(df)}
        before["memory_bytes"] = df.memory_usage()
        if reset:
            df.clear()
    except CeleryCrawlError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps({**before, "reset": reset}))
        return
    typer.echo(
        f"{spider}: dedup scope {scope}; {df.kind} filter with {before['fingerprints']:,}"
        f" fingerprints in {before['memory_bytes']:,} bytes"
    )
    if scope == "job":
        typer.echo("  its jobs each have a filter of their own: this one holds what no job sent")
    if reset:
        typer.echo("  reset: every fingerprint forgotten; the next jobs crawl those pages again")


@cli.command()
def exporter(
    app: AppOption = None,
    port: Annotated[int, typer.Option(help="port of /metrics")] = 9410,
    addr: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
) -> None:
    """Serve the crawl's metrics (queues, dedup, stats, jobs) for Prometheus."""
    from celery_crawl.hosting.project import project_of
    from celery_crawl.hosting.registry import Registry
    from celery_crawl.tools.exporter import serve

    celery_app = open_app(app)
    client, spiders = spider_keys(celery_app)
    workers = Registry.from_settings(project_of(celery_app).settings)
    try:
        server, thread = serve(client, spiders, port, addr, workers)
    except OSError as exc:  # the port is taken, or the address is not this machine's
        err.print(
            f"[red]error:[/red] cannot serve on {addr}:{port}: {exc.strerror or exc};"
            " pick another with --port (or --addr)"
        )
        raise typer.Exit(2) from None
    err.print(f"serving http://{addr}:{port}/metrics for {len(spiders)} spiders")
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        server.shutdown()


def follow(
    jobs: list[Any], timeout: float, quiet: bool, registry: Any = None
) -> list[dict[str, Any]]:
    """Poll the jobs until all are finished, with a progress bar per job.

    A job that no live worker hosts says so in its bar (from ``registry``,
    read once a second), and once on the error stream.
    """
    from celery_crawl.hosting.registry import waiting_reason

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[items]} items"),
        TimeElapsedColumn(),
    )
    deadline = time.monotonic() + timeout
    with Progress(*columns, console=err, disable=quiet) as progress:
        bars = {
            job.id: progress.add_task(f"{job.spider} {job.id[:8]}", total=None, items=0)
            for job in jobs
        }
        said: set[str] = set()
        workers: list[Any] = []
        next_read = 0.0
        while True:
            statuses = [job.status() for job in jobs]
            if registry is not None and time.monotonic() >= next_read:
                workers, next_read = registry.read(jobs[0].client), time.monotonic() + 1.0
            for status in statuses:
                total = status.done + status.queued + status.in_flight
                waiting = waiting_reason(workers, status.spider) if registry else ""
                if waiting and not status.finished and waiting not in said and not quiet:
                    said.add(waiting)
                    err.print(f"[yellow]{waiting}[/yellow]")
                label = f"{status.spider} {status.job_id[:8]}" + (
                    f" ({waiting})" if waiting else ""
                )
                progress.update(
                    bars[status.job_id],
                    description=label,
                    completed=status.done,
                    total=total,
                    items=status.items,
                )
            if all(s.finished for s in statuses) or time.monotonic() > deadline:
                return [s.as_dict() for s in statuses]
            time.sleep(0.2)


cli.add_typer(sources_cli.cli, name="sources")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
