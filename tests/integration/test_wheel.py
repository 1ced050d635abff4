"""The built wheel, installed (not editable) in a fresh virtual environment: it installs
``celery_crawl`` and nothing else at the top level, and ``celery-crawl demo --once`` runs
from an empty folder.

The wheel is built from a copy of the checkout's files, ``tasks/`` included, so that
what the source tree holds cannot leak in. It is installed without its dependencies
(a fresh install of all of them takes minutes): the new environment reads them from
this one's site-packages through a ``.pth`` line, which adds the folder to ``sys.path``
without running this environment's own ``.pth`` files, so the editable install of the
checkout stays out. Every command runs from an empty folder with ``PYTHONPATH`` unset.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from celery_crawl.demo.site import SiteConfig
from tests.support import ROOT

SOURCES = ("pyproject.toml", "README.md", "LICENSE", "celery_crawl", "tasks")


def run(
    command: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    assert (source / "tasks" / "__init__.py").is_file()  # in the tree, not in the wheel
    dist = tmp_path_factory.mktemp("dist")
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), "."], source, 240
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (found,) = dist.glob("celery_crawl-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment holding the wheel; its dependencies are this one's."""
    venv = tmp_path_factory.mktemp("venv")
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv, 120)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], venv, 60
    )
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(site.stdout.strip()) / "dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps"]
    done = run([*install, "--no-index", str(wheel)], venv, 180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return venv / "bin"


@pytest.fixture
def user_env() -> dict[str, str]:
    unset = ("PYTHONPATH", "REDIS_URL", "CELERY_CRAWL_APP", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in unset}


def test_the_wheel_holds_celery_crawl_and_its_metadata_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"celery_crawl", wheel.name.split("-py3")[0] + ".dist-info"}, top
    assert "celery_crawl/demo/runner.py" in names and "celery_crawl/demo/site.py" in names
    assert "celery_crawl/queue/lua/enqueue.lua" in names  # the package data goes too


def test_installed_celery_crawl_comes_from_the_wheel_and_tasks_is_not_there(
    installed: Path, tmp_path: Path, user_env: dict[str, str]
) -> None:
    python = str(installed / "python")
    code = "import celery_crawl; print(celery_crawl.__file__)"
    library = run([python, "-c", code], tmp_path, 60, env=user_env)
    assert library.returncode == 0, library.stderr
    assert Path(library.stdout.strip()).is_relative_to(installed.parent), library.stdout
    tasks = run([python, "-c", "import tasks"], tmp_path, 60, env=user_env)
    assert tasks.returncode == 1
    assert "ModuleNotFoundError: No module named 'tasks'" in tasks.stderr, tasks.stderr


def test_the_demo_runs_once_from_an_empty_folder(
    installed: Path, tmp_path: Path, user_env: dict[str, str]
) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    demo = [str(installed / "celery-crawl"), "demo", "--once", "--forums", "1"]
    done = run(demo, folder, 240, env={**user_env, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    expected = SiteConfig(forums=1).expected()
    summary = done.stdout[done.stdout.rindex("summary") :]
    assert re.search(rf"│ items +│ {expected.posts + expected.comments} ", summary), summary
    assert "celery-crawl status -A celery_crawl.demo" in done.stdout
    items = list((folder / "items").rglob("*.jsonl"))  # the default folder, under the cwd
    assert sum(len(f.read_text().splitlines()) for f in items) == expected.posts + expected.comments
    assert [p.name for p in tmp_path.iterdir()] == ["empty"]  # the demo's logs folder is gone
    assert not running_from(installed.parent)  # every process it started was stopped


def running_from(venv: Path) -> list[str]:
    """The command lines of the processes whose program lies in ``venv``, from /proc."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if words[0].startswith(str(venv).encode()):
            found.append(b" ".join(words).decode(errors="replace"))
    return found
