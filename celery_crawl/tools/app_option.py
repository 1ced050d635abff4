"""The ``--app`` option every ``celery-crawl`` command that needs the Celery app takes."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

from celery_crawl.core.errors import CeleryCrawlError

APP_ENVVAR = "CELERY_CRAWL_APP"
NO_APP = (
    f"error: no Celery app: pass --app (e.g. --app myproject.celery) or set {APP_ENVVAR}; "
    "for the bundled example, --app celery_crawl.demo"
)

err = Console(stderr=True)


def load_app(name: str) -> Any:
    """``module`` or ``module:attribute``, as in ``celery -A``."""
    module_name, _, attribute = name.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute or "app")


AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        "-A",
        envvar=APP_ENVVAR,
        help="your Celery app, as in `celery -A`: module or module:attribute "
        "(e.g. myproject.celery); `--app celery_crawl.demo` for the bundled example",
        show_default=False,
    ),
]


def open_app(app: str | None) -> Any:
    """The app ``--app`` or ``CELERY_CRAWL_APP`` names, found from the current directory too."""
    if not app:
        print(NO_APP, file=sys.stderr)
        raise typer.Exit(2)
    sys.path.insert(0, os.getcwd())
    try:
        return load_app(app)
    except (CeleryCrawlError, ImportError, AttributeError) as exc:
        err.print(
            f"[red]error:[/red] cannot load the app {app!r}: {exc}. Pass the module that"
            " defines your Celery app, as for celery -A (run from the folder that holds it,"
            " or put that folder on PYTHONPATH); --app celery_crawl.demo is the bundled example"
        )
        raise typer.Exit(2) from None
