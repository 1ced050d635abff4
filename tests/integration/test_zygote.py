"""The tests' zygote (tests/support/zygote.py): a run forked from it is the run a new
interpreter makes, and a child that fails never takes the zygote's place."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT, workers


@pytest.fixture
def env() -> dict[str, str]:
    """The environment the zygote starts with: what it forks (``Zygote.fits``)."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def fresh(env: dict[str, str]) -> dict[str, str]:
    return {**env, "CELERY_CRAWL_TEST_ZYGOTE": "0"}


def as_new_interpreter(run: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    return run.returncode, run.stdout, run.stderr


def test_a_failing_script_exits_1_with_its_traceback_and_the_zygote_serves_on(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "fails.py"
    script.write_text("print('before', flush=True)\nraise ValueError('broken')\n")
    zygote = workers._zygote()
    assert zygote.fits(env, tmp_path)
    forked = workers.run_script(script, env, timeout=60)
    assert forked.returncode == 1 and forked.stdout == "before\n"
    assert forked.stderr.rstrip().endswith("ValueError: broken"), forked.stderr
    assert zygote.alive() and workers._zygote() is zygote  # it serves on, not replaced
    again = workers.run_script(script, env, timeout=60)
    assert as_new_interpreter(again) == as_new_interpreter(forked)
    monkeypatch.setenv("CELERY_CRAWL_TEST_ZYGOTE", "0")
    new = workers.run_script(script, env, timeout=60)
    assert (new.returncode, new.stdout) == (1, "before\n")
    assert new.stderr.rstrip().endswith("ValueError: broken")


def test_the_command_line_forked_says_what_a_new_interpreter_says(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``celery_crawl.tools.cli`` is preloaded: run as ``-m``, it runs anew as __main__,
    without runpy's warning of a module imported before it ran."""
    args = ["status", "--help"]
    forked = workers.run_module("celery_crawl.tools.cli", args, env, timeout=60)
    monkeypatch.setenv("CELERY_CRAWL_TEST_ZYGOTE", "0")
    new = workers.run_module("celery_crawl.tools.cli", args, env, timeout=60)
    assert forked.returncode == 0 and "RuntimeWarning" not in forked.stderr, forked.stderr
    assert as_new_interpreter(forked) == as_new_interpreter(new)
