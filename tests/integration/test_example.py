"""The library apart from its examples: no import of them, an app asked for, commands by plugin.

There are two: the checkout's application (``tasks``, not installed) and the
forum application the wheel ships for the demo (``celery_crawl.demo``), which
is built on the library and never imports ``tasks``.

Every command runs the installed ``celery-crawl`` script in a fresh folder
outside the checkout, as a user would.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

LIBRARY = ROOT / "celery_crawl"
DEMO = LIBRARY / "demo"
SCRIPT = str(Path(sys.executable).with_name("celery-crawl"))
EXAMPLES = ("tasks", "celery_crawl.demo")


def celery_crawl(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("CELERY_CRAWL_APP", "PYTHONPATH")}
    return subprocess.run(
        [SCRIPT, *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def names_the_example(value: str, examples: tuple[str, ...] = EXAMPLES) -> bool:
    return any(value == name or value.startswith((f"{name}.", f"{name}:")) for name in examples)


def example_references(tree: ast.AST, examples: tuple[str, ...] = EXAMPLES) -> list[str]:
    """Imports of an example, and module names of it in strings (``import_module("tasks")``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if names_the_example(alias.name, examples)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module] if names_the_example(node.module, examples) else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [node.value] if names_the_example(node.value, examples) else []
    return found


def references(paths: list[Path], examples: tuple[str, ...]) -> dict[str, list[str]]:
    return {
        str(path.relative_to(LIBRARY)): refs
        for path in paths
        if (refs := example_references(ast.parse(path.read_text(), str(path)), examples))
    }


def test_no_library_module_imports_the_example() -> None:
    modules = sorted(p for p in LIBRARY.rglob("*.py") if not p.is_relative_to(DEMO))
    assert len(modules) > 10
    assert references(modules, EXAMPLES) == {}


def test_the_demo_application_needs_no_checkout() -> None:
    """What the wheel ships for the demo never names the checkout's ``tasks``."""
    modules = sorted(DEMO.rglob("*.py"))
    assert len(modules) >= 6
    assert references(modules, ("tasks",)) == {}


def test_the_scan_sees_every_kind_of_reference() -> None:
    source = 'import tasks\nfrom tasks.site import x\nimport_module("tasks.demo")\n"tasks:app"'
    found = example_references(ast.parse(source))
    assert sorted(found) == ["tasks", "tasks.demo", "tasks.site", "tasks:app"]
    assert example_references(ast.parse('import tasksets\n"--app tasks for the example"')) == []
    source = (
        'from celery_crawl.demo.site import x\nimport celery_crawl.demo\n"celery_crawl.demo:app"'
    )
    found = example_references(ast.parse(source))
    assert sorted(found) == ["celery_crawl.demo", "celery_crawl.demo.site", "celery_crawl.demo:app"]
    assert example_references(ast.parse('import celery_crawl.demos\n"-A celery_crawl.demo"')) == []


@pytest.mark.parametrize("args", [("crawl", "forum", "00001"), ("status",), ("exporter",)])
def test_a_command_without_an_app_says_what_to_pass(args: tuple[str, ...], tmp_path: Path) -> None:
    done = celery_crawl(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: no Celery app: pass --app (e.g. --app myproject.celery) or set "
        "CELERY_CRAWL_APP; for the bundled example, --app celery_crawl.demo"
    ]
    assert "Traceback" not in done.stdout + done.stderr


def test_the_app_comes_from_the_environment_too(tmp_path: Path) -> None:
    done = celery_crawl("status", cwd=tmp_path, env={"CELERY_CRAWL_APP": "no_such_app_module"})
    assert done.returncode == 2
    assert "cannot load the app 'no_such_app_module'" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_help_describes_app(tmp_path: Path) -> None:
    done = celery_crawl("status", "--help", cwd=tmp_path, env={"COLUMNS": "200"})
    assert done.returncode == 0
    assert "your Celery app, as in `celery -A`" in done.stdout
    assert "CELERY_CRAWL_APP" in done.stdout


def test_celery_crawl_alone_shows_a_clean_help_and_succeeds(tmp_path: Path) -> None:
    done = celery_crawl(cwd=tmp_path, env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == celery_crawl("--help", cwd=tmp_path, env={"COLUMNS": "100"}).stdout
    for mentioned in ("celery-crawl demo", "--app/-A", "REDIS_URL", "CELERY_CRAWL_APP", "dedup"):
        assert mentioned in done.stdout
    assert "``" not in done.stdout


def test_the_example_adds_demo_and_site_through_the_entry_point(tmp_path: Path) -> None:
    from importlib.metadata import entry_points

    plugins = {ep.name: ep.value for ep in entry_points(group="celery_crawl.commands")}
    assert plugins["demo"] == "celery_crawl.demo.runner:command"
    assert plugins["site"] == "celery_crawl.demo.site:command"
    done = celery_crawl("--help", cwd=tmp_path, env={"COLUMNS": "200"})
    assert done.returncode == 0 and done.stderr == ""
    listed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("│ ")]
    assert listed[-2:] == ["demo", "site"]
    assert {"crawl", "status", "exporter"} <= set(listed)
    assert "Run everything locally" in done.stdout
    site_help = celery_crawl("site", "--help", cwd=tmp_path)
    assert site_help.returncode == 0 and "usage: celery-crawl site" in site_help.stdout


def test_a_plugin_that_fails_to_import_costs_one_warning_line(tmp_path: Path) -> None:
    """A real installed distribution (its metadata on PYTHONPATH) naming a missing module."""
    info = tmp_path / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[celery_crawl.commands]\nbroken = no_such_plugin_module:command\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "COLUMNS": "200"}
    warning = (
        "warning: command 'broken' (no_such_plugin_module:command) not loaded: "
        "ModuleNotFoundError: No module named 'no_such_plugin_module'"
    )
    listing = celery_crawl("--help", cwd=tmp_path, env=env)
    assert listing.returncode == 0, listing.stderr
    assert listing.stderr.splitlines() == [warning]
    assert "demo" in listing.stdout and "broken" not in listing.stdout
    other = celery_crawl("status", cwd=tmp_path, env=env)  # loads no plugin at all
    assert other.returncode == 2 and "warning" not in other.stderr
    itself = celery_crawl("broken", cwd=tmp_path, env=env)
    assert itself.returncode == 2 and itself.stderr.splitlines()[0] == warning
    assert "No such command 'broken'" in itself.stderr
