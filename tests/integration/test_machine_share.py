"""The suite's own sharing of the machine (tests/support/machine_share.py), in a pytest run of
its own with four xdist workers: while an ``alone`` test runs, every other test runs in
``SCHED_IDLE`` (where the run may set a thread back, as root) or on the other CPUs (pinned);
one ``alone`` test at a time; ``alone(machine=True)`` runs while no other test does; a
``browser`` test never beside another, nor beside an ``alone`` one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from itertools import combinations
from pathlib import Path

import pytest

from tests.support import machine_share
from tests.support.machine_share import CPUS, IDLE_OTHERS

ROOT = Path(__file__).resolve().parents[2]

PROBES = textwrap.dedent(
    """
    import json, os, time
    import pytest

    def probe(name):
        start, cpus = time.time(), sorted(os.sched_getaffinity(0))
        policy = os.sched_getscheduler(0)
        time.sleep(0.4)
        with open(os.environ["PROBE_LOG"], "a") as log:
            worker = os.environ["PYTEST_XDIST_WORKER"]
            log.write(json.dumps([name, start, time.time(), cpus, worker, policy]) + "\\n")

    @pytest.mark.parametrize("i", range(4))
    @pytest.mark.alone
    def test_alone(i):
        probe(f"alone{i}")

    @pytest.mark.parametrize("i", range(4))
    @pytest.mark.browser
    def test_browser(i):
        probe(f"browser{i}")

    @pytest.mark.parametrize("i", range(16))
    def test_plain(i):
        probe(f"plain{i}")

    @pytest.mark.parametrize("i", range(2))
    @pytest.mark.alone(machine=True)
    def test_whole(i):
        probe(f"whole{i}")
    """
)

# the kinds of test that must never run at the same time
APART = [{"whole", kind} for kind in ("whole", "alone", "browser", "plain")]
APART += [{"alone"}, {"browser"}, {"alone", "browser"}]


def assert_placed(name: str, cpus: list[int], policy: int, during_alone: bool) -> None:
    """Where a probe ran: an alone one on the first CPU, a test beside it on the others;
    or, with ``IDLE_OTHERS``, every probe on every CPU, one beside an alone test idle."""
    if IDLE_OTHERS:  # every CPU to everyone; the others run only where it leaves one idle
        assert cpus == sorted(CPUS), (name, cpus)
        if name.startswith("alone"):
            assert policy == os.SCHED_OTHER, (name, policy)
        elif during_alone:
            assert policy == os.SCHED_IDLE, (name, policy)
    elif name.startswith("alone"):
        assert cpus == sorted(CPUS)[:1], (name, cpus)
    elif during_alone:
        assert cpus == sorted(CPUS)[1:], (name, cpus)


@pytest.mark.skipif(len(CPUS) < 2, reason="pinning needs two CPUs; one CPU locks instead")
def test_pinning_a_process_pins_each_of_its_threads() -> None:
    """Without the right to idle the others, an alone test's processes are pinned: the
    threads they started before (a crawler's reactor, say) too, not only the main one."""
    code = "import threading, time\n"
    code += "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        first = {min(CPUS)}
        machine_share._pin({proc.pid}, {proc.pid}, first, set(CPUS) - first)
        threads = machine_share._threads(proc.pid)
        assert len(threads) == 2
        assert [os.sched_getaffinity(tid) for tid in threads] == [first, first]
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.alone(machine=True)  # the run places its own processes: nothing else beside it
@pytest.mark.skipif(len(CPUS) < 2, reason="pinning needs two CPUs; one CPU locks instead")
def test_alone_tests_go_first_and_the_locks_keep_kinds_apart(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_probes.py").write_text(PROBES)
    log = tmp_path / "probes.jsonl"
    env = {**os.environ, "PROBE_LOG": str(log)}
    env.pop("PYTEST_XDIST_WORKER", None)
    command = [sys.executable, "-m", "pytest", "-q", "-n", "4", "-p", "no:randomly"]
    command += [
        "--rootdir",
        str(ROOT),
        "-c",
        str(ROOT / "pyproject.toml"),
        "-p",
        "tests.support.machine_share",
    ]
    command += ["--basetemp", str(tmp_path / "run"), str(tmp_path / "test_probes.py")]
    done = subprocess.run(
        command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    runs = {name: (start, end, cpus) for name, start, end, cpus, *_ in records}
    policies = {name: policy for name, *_, policy in records}
    assert len(runs) == 26
    # the two whole-machine tests, defined last, are collected first and run first, in a row
    # on one worker, which keeps the machine between them: every other test starts after
    workers = {name: worker for name, _, _, _, worker, _ in records}
    assert workers["whole0"] == workers["whole1"], workers
    whole_end = max(runs["whole0"][1], runs["whole1"][1])
    assert all(start >= whole_end for name, (start, _, _) in runs.items() if "whole" not in name)
    for name, (start, _, cpus) in runs.items():
        during_alone = any(
            other.startswith("alone") and s < start < e for other, (s, e, _) in runs.items()
        )
        assert_placed(name, cpus, policies[name], during_alone)
    for (a, (sa, ea, _)), (b, (sb, eb, _)) in combinations(runs.items(), 2):
        kinds = {a.rstrip("0123456789"), b.rstrip("0123456789")}
        if kinds in APART:
            assert ea <= sb or eb <= sa, (a, b)
