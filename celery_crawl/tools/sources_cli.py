"""``celery-crawl sources``: a project's sources on their own schedules, managed at run time.

    celery-crawl sources add SPIDER ID --seed SEED... [--interval S] [--adaptive ...]
    celery-crawl sources list [SPIDER] [--json]
    celery-crawl sources show SPIDER ID [--json]
    celery-crawl sources pause|resume|remove SPIDER ID
    celery-crawl sources import FILE [--sync] [--splay]
    celery-crawl sources export

Changes take effect at the producer's next tick (``celery_crawl.produce``): no deploy,
no restart. See :mod:`celery_crawl.producer.schedule` and docs/producer.md.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from celery_crawl.core.errors import CeleryCrawlError
from celery_crawl.jobs.limits import describe as describe_limits
from celery_crawl.producer import sources_file
from celery_crawl.producer.schedule import Source, SourceState
from celery_crawl.tools import app_option as base

cli = typer.Typer(
    help="Sources on their own schedules: each due its interval after its last job started.",
    no_args_is_help=True,
)

SpiderArg = Annotated[str, typer.Argument(help="spider name")]
IdArg = Annotated[str, typer.Argument(help="source id: A-Z a-z 0-9 _ . -")]
JsonOption = Annotated[bool, typer.Option("--json", help="print machine-readable JSON")]


def _project(app: str | None) -> Any:
    from celery_crawl.hosting.project import project_of

    return project_of(base.open_app(app))


def _warn_if_not_produced(project: Any, spider: str) -> None:
    """A spider without a beat entry never ticks: its sources would wait forever."""
    from celery_crawl.core.defaults import setting

    if spider not in setting(project.settings, "PRODUCER_SPIDERS"):
        base.err.print(
            f"[yellow]warning:[/yellow] {spider} is not in PRODUCER_SPIDERS: beat has no entry"
            " for it, so its sources get no job until it has one"
        )


def _fail(exc: Exception) -> typer.Exit:
    base.err.print(f"[red]error:[/red] {exc}")
    return typer.Exit(2)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    found = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep:
            raise typer.BadParameter(f"{what} {value!r}: NAME=VALUE")
        found[name] = text
    return found


@cli.command()
def add(
    spider: SpiderArg,
    source_id: IdArg,
    *,
    seed: Annotated[list[str], typer.Option(help="a seed of each job (JSON or a bare value)")],
    interval: Annotated[
        float, typer.Option(help="seconds from one job's start to the next")
    ] = 3600,
    adaptive: Annotated[
        bool, typer.Option(help="sooner after a job with items, later after one without")
    ] = False,
    min_interval: Annotated[float | None, typer.Option(help="adaptive: shortest")] = None,
    max_interval: Annotated[float | None, typer.Option(help="adaptive: longest")] = None,
    priority: Annotated[int, typer.Option(help="the jobs' priority")] = 0,
    arg: Annotated[list[str] | None, typer.Option(help="spider argument NAME=VALUE")] = None,
    limit: Annotated[
        list[str] | None,
        typer.Option(help=f"a job limit, NAME=NUMBER (repeatable): {describe_limits()}"),
    ] = None,
    paused: Annotated[bool, typer.Option(help="paused: no job until resumed")] = False,
    app: base.AppOption = None,
) -> None:
    """Add a source, or change one: it keeps its due time, and stays paused if it was."""
    from celery_crawl.hosting.project import parse_seed

    try:
        project = _project(app)
        project.check_hostable(spider)
        spidercls = project.spider_class(spider)
        limits = {name: float(value) for name, value in _pairs(limit or [], "limit").items()}
        source = Source(
            source_id,
            seeds=[parse_seed(spidercls, text) for text in seed],
            interval=interval,
            adaptive=adaptive,
            min_interval=min_interval,
            max_interval=max_interval,
            priority=priority,
            args=_pairs(arg or [], "arg"),
            limits=limits,
        )
        outcome = project.schedule(spider).put(source, paused=True if paused else None)
    except (CeleryCrawlError, ValueError) as exc:
        raise _fail(exc) from None
    typer.echo(f"{spider}/{source_id}: {outcome}{', paused' if paused else ''}")
    _warn_if_not_produced(project, spider)


def _row(spider: str, state: SourceState, now: float) -> dict[str, Any]:
    due = state.due_at
    return {
        "spider": spider,
        "id": state.source.id,
        "interval": state.interval,
        "adaptive": state.source.adaptive,
        "paused": state.paused,
        "running_job": state.running_job,
        "due_in": None if due is None else round(due - now, 1),
        "source": asdict(state.source),
    }


@cli.command("list")
def list_sources(
    spider: Annotated[str | None, typer.Argument(help="one spider (default: all)")] = None,
    as_json: JsonOption = False,
    app: base.AppOption = None,
) -> None:
    """Every source, with its interval and when it is due (negative: overdue)."""
    try:
        project = _project(app)
        spiders = [spider] if spider else project.spider_names()
        now = time.time()
        rows = [_row(name, s, now) for name in spiders for s in project.schedule(name).states()]
    except CeleryCrawlError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(rows))
        return
    for row in rows:
        when = (
            "paused"
            if row["paused"]
            else f"running job {row['running_job']}"
            if row["running_job"]
            else f"due in {row['due_in']:g} s"
            if row["due_in"] is not None
            else "not due (its key was repaired?): add it again"
        )
        kind = "adaptive" if row["adaptive"] else "fixed"
        typer.echo(f"{row['spider']}/{row['id']}: every {row['interval']:g} s ({kind}); {when}")
    if not rows:
        typer.echo("no sources: add one with celery-crawl sources add SPIDER ID --seed SEED")


@cli.command()
def show(
    spider: SpiderArg, source_id: IdArg, as_json: JsonOption = False, app: base.AppOption = None
) -> None:
    """One source's definition, interval and state."""
    try:
        state = _project(app).schedule(spider).get(source_id)
    except CeleryCrawlError as exc:
        raise _fail(exc) from None
    if state is None:
        raise _fail(CeleryCrawlError(f"no source {source_id!r} for spider {spider!r}"))
    typer.echo(json.dumps(_row(spider, state, time.time()), indent=None if as_json else 2))


def _switch(spider: str, source_id: str, app: str | None, verb: str) -> None:
    try:
        schedule = _project(app).schedule(spider)
        done = getattr(schedule, verb)(source_id)
    except CeleryCrawlError as exc:
        raise _fail(exc) from None
    if not done:
        raise _fail(CeleryCrawlError(f"no source {source_id!r} for spider {spider!r}"))
    typer.echo(f"{spider}/{source_id}: {verb}d")


@cli.command()
def pause(spider: SpiderArg, source_id: IdArg, app: base.AppOption = None) -> None:
    """No more jobs of the source (one running goes on) until it is resumed."""
    _switch(spider, source_id, app, "pause")


@cli.command()
def resume(spider: SpiderArg, source_id: IdArg, app: base.AppOption = None) -> None:
    """The source due again: now, or when its running job ends."""
    _switch(spider, source_id, app, "resume")


@cli.command()
def remove(spider: SpiderArg, source_id: IdArg, app: base.AppOption = None) -> None:
    """Remove the source (a job of it that runs goes on)."""
    _switch(spider, source_id, app, "remove")


@cli.command("import")
def import_file(
    path: Annotated[Path, typer.Argument(help="a .yaml, .toml or .json file", exists=True)],
    sync: Annotated[
        bool, typer.Option(help="remove the sources of the file's spiders that it lacks")
    ] = False,
    splay: Annotated[
        bool,
        typer.Option(
            help="spread the new sources' first jobs over their first interval, not all now"
        ),
    ] = False,
    app: base.AppOption = None,
) -> None:
    """Add or change the file's sources (docs/producer.md shows the format)."""
    try:
        found = sources_file.read(path)
        project = _project(app)
        for spider in found:
            project.check_hostable(spider)
        for spider, sources in found.items():
            counts = sources_file.load(project.schedule(spider), sources, sync=sync, splay=splay)
            typer.echo(f"{spider}: " + ", ".join(f"{n} {what}" for what, n in counts.items()))
            _warn_if_not_produced(project, spider)
    except (CeleryCrawlError, OSError) as exc:
        raise _fail(exc) from None


@cli.command()
def export(app: base.AppOption = None) -> None:
    """Every source, as YAML that ``import`` takes back."""
    try:
        project = _project(app)
        schedules = {name: project.schedule(name) for name in project.spider_names()}
        typer.echo(sources_file.dump(schedules), nl=False)
    except CeleryCrawlError as exc:
        raise _fail(exc) from None
