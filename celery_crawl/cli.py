"""The ``celery-crawl`` command line.

    celery-crawl crawl SPIDER SEED... [--priority N] [--wait] [--json] [--app tasks]
    celery-crawl site [--port 8000] [--forums N] ...   # the demo forum site

Each SEED starts one job. A seed is JSON (``'{"forum_id": "00001"}'``) or a
bare value for the spider's ``seed_key`` (``00001`` for the forum spider).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from celery_crawl.errors import CeleryCrawlError

cli = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
err = Console(stderr=True)


def load_app(name: str) -> Any:
    """``module`` or ``module:attribute``, as in ``celery -A``."""
    module_name, _, attribute = name.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute or "app")


@cli.callback()
def root() -> None:
    """Distributed Scrapy crawls on Celery workers."""


@cli.command()
def crawl(
    spider: Annotated[str, typer.Argument(help="spider name")],
    seeds: Annotated[list[str], typer.Argument(help="one job per seed")],
    *,
    priority: Annotated[int, typer.Option(help="job priority, added to every request")] = 0,
    wait: Annotated[
        bool, typer.Option("--wait", help="show progress until every job is done")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print machine-readable JSON")] = False,
    app: Annotated[str, typer.Option("--app", "-A", envvar="CELERY_CRAWL_APP")] = "tasks",
    timeout: Annotated[float, typer.Option(help="seconds --wait waits at most")] = 3600.0,
) -> None:
    """Start crawl jobs; with --wait, follow them until they are done."""
    from celery_crawl.celery_app import crawl as start
    from celery_crawl.celery_app import project_of
    from celery_crawl.project import parse_seed

    sys.path.insert(0, os.getcwd())
    try:
        celery_app = load_app(app)
        spidercls = project_of(celery_app).spider_class(spider)
        jobs = [start(spider, [parse_seed(spidercls, s)], priority, app=celery_app) for s in seeds]
    except (CeleryCrawlError, ImportError, AttributeError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if not wait:
        ids = [job.id for job in jobs]
        typer.echo(json.dumps({"jobs": ids}) if as_json else "\n".join(ids))
        return
    results = follow(jobs, timeout, quiet=as_json)
    if as_json:
        typer.echo(json.dumps(results, indent=2))
    raise typer.Exit(0 if all(r["state"] == "done" for r in results) else 1)


@cli.command(
    "site",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def site(context: typer.Context) -> None:
    """Serve the demo forum site (options: see `celery-crawl site --help`)."""
    from celery_crawl import demo_site

    raise typer.Exit(demo_site.main(context.args))


@cli.command()
def demo(
    once: Annotated[bool, typer.Option("--once", help="exit after the first round")] = False,
    forums: Annotated[int, typer.Option(help="forums on the demo site")] = 3,
    items: Annotated[str, typer.Option(help="folder for the item files")] = "items",
) -> None:
    """Run everything locally: Redis, demo site, worker, beat, Flower, live progress.

    Run it from the checkout: the worker loads the forum app in `tasks/`.
    """
    from celery_crawl.demo import run

    sys.path.insert(0, os.getcwd())
    raise typer.Exit(run(forums=forums, once=once, items_dir=items))


def follow(jobs: list[Any], timeout: float, quiet: bool) -> list[dict[str, Any]]:
    """Poll the jobs until all are finished, with a progress bar per job."""
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
        while True:
            statuses = [job.status() for job in jobs]
            for status in statuses:
                total = status.done + status.queued + status.in_flight
                progress.update(
                    bars[status.job_id], completed=status.done, total=total, items=status.items
                )
            if all(s.finished for s in statuses) or time.monotonic() > deadline:
                return [s.as_dict() for s in statuses]
            time.sleep(0.2)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
