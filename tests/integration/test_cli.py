"""The command line, run as a user would (the crawl command is tested with workers)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from celery_crawl.tools import embedded
from tests.support.ports import free_port
from tests.support.procs import command_line, descendants, stat_fields


def test_site_subcommand_serves_the_demo_forum() -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "celery_crawl.tools.cli",
        "site",
        "--port",
        str(port),
        "--forums",
        "2",
    ]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline, page = time.monotonic() + 30, None
        while page is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/list/00002/1", timeout=2
                ) as r:
                    page = json.loads(r.read())
            except OSError:
                time.sleep(0.1)
        assert page is not None and page["forum_id"] == "00002" and page["page"] == 1
    finally:
        server.terminate()
        server.wait(10)


def test_help_lists_the_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery_crawl.tools.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert "crawl" in done.stdout and "site" in done.stdout


def test_demo_once_runs_everything_and_summarises(tmp_path: Path) -> None:
    """Embedded Valkey, demo site, a real worker, beat and Flower, then a summary.

    Run as installed, from a fresh folder outside the checkout that holds a
    ``tasks.py`` of its own: the demo still runs the bundled example.
    """
    import os

    from celery_crawl.demo.site import SiteConfig

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
    items = tmp_path / "items"
    (tmp_path / "tasks.py").write_text("raise ImportError('not the example')\n")
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("celery-crawl")),
            "demo",
            "--once",
            "--forums",
            "2",
            "--items",
            str(items),
            "--keep-logs",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    kept = re.search(r"logs kept in (\S+)", done.stdout)
    assert kept, done.stdout[-3000:]
    logs = Path(shutil.move(kept.group(1), tmp_path / "logs"))  # kept with the test's folder
    expected = SiteConfig(forums=2).expected()
    assert "password" in done.stdout and "Flower      http://127.0.0.1:" in done.stdout
    assert "export REDIS_URL=redis://" in done.stdout  # how to try it by hand
    assert f"│ items      │ {expected.posts + expected.comments}" in done.stdout
    assert f"│ pages      │ {expected.pages + expected.not_found}" in done.stdout
    assert "│ 429s       │ 0 " in done.stdout  # the site's rate limit was never reached
    lines = [line for f in items.rglob("*.jsonl") for line in f.read_text().splitlines()]
    assert len(lines) == expected.posts + expected.comments, feed_lines(logs)
    # a folder per job (one per forum), no empty file (the list spider's, which yields no item)
    assert len({f.parent for f in items.rglob("*.jsonl")}) == 2
    assert all(f.stat().st_size for f in items.rglob("*.jsonl"))


def feed_lines(logs: Path) -> list[str]:
    """What the demo's workers logged of their feeds, and their errors."""
    wanted = ("Stored ", " ERROR", "CRITICAL", "Error caught")
    worker_logs = sorted(logs.glob("worker*.log"))
    text = [line for f in worker_logs for line in f.read_text(errors="replace").splitlines()]
    return [line for line in text if any(word in line for word in wanted)][-60:]


def start_demo(folder: Path, env: dict[str, str], out: Any) -> subprocess.Popen[bytes]:
    """``celery-crawl demo --forums 1`` in its own process group, as a shell job is."""
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("celery-crawl")), "demo", "--forums", "1"],
        cwd=folder,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def alive(pid: int) -> bool:
    try:
        state = stat_fields(pid)[0]
    except OSError:
        return False
    return state != "Z"


def lasting(pid: int) -> set[int]:
    """The demo's processes that run until it stops: all but the one-shot ``kick``, which
    produces the first round and exits 0 (a count that needs it races with its end)."""
    return {
        child
        for child in descendants(pid)
        if alive(child) and b"celery_crawl.produce" not in command_line(child)
    }


DEMO_LOGS = "celery-crawl-demo-*/*.log"  # in the demo's TMPDIR
WORKER_LOGS = "celery-crawl-demo-*/worker-*.log"


def logs_tail(folder: Path, lines: int = 15) -> dict[str, list[str]]:
    """The last lines of each log a demo keeps in ``folder`` (its TMPDIR)."""
    return {
        log.name: log.read_text(errors="replace").splitlines()[-lines:]
        for log in sorted(folder.glob(DEMO_LOGS))
    }


def crawling(folder: Path) -> bool:
    """Whether a demo worker has joined a job: its crawl is under way."""
    return any(" joined: " in log for log in worker_logs(folder))


def worker_logs(folder: Path) -> list[str]:
    """The demo workers' logs, kept in ``folder`` (its TMPDIR)."""
    return [log.read_text(errors="replace") for log in sorted(folder.glob(WORKER_LOGS))]


def cmdline(pid: int) -> str:
    raw = command_line(pid)
    return raw.replace(b"\0", b" ").decode()[:200] if raw else f"{pid} (gone)"


def flower_lists_workers(output: str, count: int, seconds: float = 30.0) -> bool:
    """Flower's /api/workers, without ?refresh=1, lists ``count`` workers within ``seconds``."""
    import base64
    import re

    found = re.search(r"Flower +(http://\S+) \(user admin, password (\S+)\)", output)
    assert found, output
    auth = base64.b64encode(f"admin:{found[2]}".encode()).decode()
    request = urllib.request.Request(
        f"{found[1]}/api/workers", headers={"Authorization": f"Basic {auth}"}
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with urllib.request.urlopen(request, timeout=5) as response:
            if len(json.loads(response.read())) >= count:
                return True
        time.sleep(0.5)
    return False


@pytest.mark.alone  # stops within 3 s
# a time measured on a shared machine: a failed measurement is taken again, twice at most,
# as the politeness rates are (reruns are listed). It failed once in CI at 3.6 s, of which
# the demo's own count, from the Ctrl-C to the last service stopped, was 2.7 s
@pytest.mark.flaky(reruns=2)
def test_ctrl_c_stops_the_demo_in_order_within_3_s_leaving_nothing(tmp_path: Path) -> None:
    """The terminal's SIGINT goes to the demo's whole process group, as a Ctrl-C does."""
    import os
    import signal

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
    temp = tmp_path / "tmp"
    temp.mkdir()
    env["TMPDIR"] = str(temp)  # the demo's and the embedded server's temporary folders
    logs = tmp_path / "out.log"
    with logs.open("wb") as out:
        demo = start_demo(tmp_path, env, out)
        try:
            deadline = time.monotonic() + 120
            items = tmp_path / "items"  # a job's feed is stored when it ends: round 1 crawled
            while not list(items.rglob("*.jsonl")) and time.monotonic() < deadline:
                assert demo.poll() is None, logs.read_text()[-3000:]
                time.sleep(0.5)
            assert flower_lists_workers(logs.read_text(), 2), "Flower's /api/workers stays {}"
            processes = descendants(demo.pid)
            assert len(processes) >= 5  # Redis and its launcher, two workers, beat, Flower
            os.killpg(demo.pid, signal.SIGINT)
            start = time.monotonic()
            try:
                code = demo.wait(30)
            except subprocess.TimeoutExpired:  # say what was still running, and its last words
                left = [cmdline(pid) for pid in processes if alive(pid)]
                pytest.fail(f"not stopped after 30 s; still running: {left}\n{logs.read_text()}")
            took = time.monotonic() - start
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
    output = logs.read_text()
    print(output[-1500:], f"stopped in {took:.2f} s", sep="\n")
    assert code == 0
    assert took < 3, output[-2000:]
    assert not [pid for pid in processes if alive(pid)]
    assert not list(temp.iterdir())
    assert "Traceback" not in output and "Error" not in output


def test_a_demo_process_that_dies_is_named_and_the_rest_stops(tmp_path: Path) -> None:
    import os
    import signal

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
    out = tmp_path / "out.log"
    with out.open("wb") as sink:
        demo = start_demo(tmp_path, env, sink)
        try:
            victim = None
            deadline = time.monotonic() + 120
            while victim is None and time.monotonic() < deadline:
                assert demo.poll() is None, out.read_text()[-3000:]
                time.sleep(0.5)
                for pid in descendants(demo.pid):
                    if b"worker-1@" in command_line(pid):
                        victim = pid
            assert victim is not None, out.read_text()[-3000:]
            time.sleep(3)  # its crawlers open
            processes = descendants(demo.pid)
            os.kill(victim, signal.SIGKILL)
            code = demo.wait(60)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
    output = out.read_text()
    assert code == 1, output[-3000:]
    assert "worker-1 exited with code -9; the last lines of its log:" in output
    assert "Traceback" not in output
    assert not [pid for pid in processes if alive(pid)]


def test_each_error_a_newcomer_meets_names_the_next_step(tmp_path: Path) -> None:
    import os
    import socket

    script = str(Path(sys.executable).with_name("celery-crawl"))
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_CRAWL_APP", "PYTHONPATH")}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [script, *args],
            cwd=tmp_path,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        done.stderr = " ".join(done.stderr.split())  # as read, whatever the wrapping
        return done

    no_redis = run(
        "crawl", "-A", "celery_crawl.demo", "forum", "00001", REDIS_URL="redis://127.0.0.1:1/0"
    )
    assert no_redis.returncode != 0 and "point REDIS_URL at yours" in no_redis.stderr
    assert "celery-crawl demo" in no_redis.stderr
    no_app = run("status", "-A", "no_such_app_module")
    assert (
        no_app.returncode == 2 and "--app celery_crawl.demo is the bundled example" in no_app.stderr
    )
    no_spider = run("crawl", "-A", "celery_crawl.demo", "nope", "00001")
    assert no_spider.returncode == 2 and "this project has: forum, forum_detail" in no_spider.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for args in (
            ("site", "--port", port),
            ("exporter", "-A", "celery_crawl.demo", "--port", port),
        ):
            busy = run(*args)
            assert busy.returncode == 2, busy.stderr
            assert f"cannot serve on 127.0.0.1:{port}" in busy.stderr and "--port" in busy.stderr
            assert "Traceback" not in busy.stderr
    for done in (no_redis, no_app, no_spider):
        assert "Traceback" not in done.stdout + done.stderr


def test_the_demo_without_flower_says_which_extra_to_install(tmp_path: Path) -> None:
    """As if Flower were not installed: the demo starts nothing and names the extra."""
    code = (
        "import importlib.util as u; real = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == 'flower' else real(name, *a)\n"
        "from celery_crawl.demo.runner import run\n"
        "raise SystemExit(run())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert 'the demo needs flower, not installed here: pip install "celery-crawl[demo]"' in (
        " ".join(done.stdout.split())
    )
    assert not list(tmp_path.iterdir())  # nothing started, no items folder


def test_a_demo_killed_with_sigkill_mid_crawl_leaves_no_process(tmp_path: Path) -> None:
    """Its children run in sessions of their own, yet die with it (PR_SET_PDEATHSIG). Redis,
    told as the workers are, waits for them to leave: they stop against a live server."""
    import os
    import signal

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
    env["TMPDIR"] = str(tmp_path)  # a killed demo cannot delete its logs folder: keep it here
    out = tmp_path / "out.log"
    with out.open("wb") as sink:
        demo = start_demo(tmp_path, env, sink)
        deadline = time.monotonic() + 120
        while len(lasting(demo.pid)) < 6 or not crawling(tmp_path):
            assert demo.poll() is None, out.read_text()[-3000:]
            assert time.monotonic() < deadline, (logs_tail(tmp_path), out.read_text()[-3000:])
            time.sleep(0.2)
        processes = descendants(demo.pid)  # with the one-shot kick, if it still runs
        names = {pid: cmdline(pid) for pid in processes}
        roles = {pid: cmdline(pid) for pid in lasting(demo.pid)}
        # launcher and Redis, 2 workers, beat, Flower: one that ended is named by its absence
        assert len(roles) >= 6, (roles, out.read_text()[-3000:])
        redis_at = re.search(r"redis://([\d.]+:\d+)", out.read_text())
        assert redis_at, out.read_text()[-3000:]
        demo.kill()  # a job runs: its crawl is under way
        demo.wait()
    # Redis waits DRAIN_SECONDS at most for the others to leave
    deadline = time.monotonic() + embedded.DRAIN_SECONDS + 30
    while [pid for pid in processes if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in processes if alive(pid)]
    for pid in left:  # not to leak them into the rest of the run
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, ({pid: names[pid] for pid in left}, logs_tail(tmp_path))
    logs = worker_logs(tmp_path)  # a worker still starting at the kill exits without a word
    assert any("Warm shutdown" in log for log in logs), logs_tail(tmp_path)
    # Redis stayed up until they left. The site, a thread of the killed launcher, did not:
    # downloads under way then were refused, which is not what this looks for
    for sign in ("Redis unreachable", f"connecting to {redis_at[1]}"):  # redis-py's refusal
        assert not any(sign in log for log in logs), (sign, logs_tail(tmp_path))


def test_bad_crawl_input_on_the_command_line_starts_no_job(db_url: str) -> None:
    """Every job's input is checked before the first starts; each refusal is short, exit 2."""
    import os

    import redis

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "REDIS_URL": db_url, "PYTHONPATH": str(root)}
    cases = [
        (["00001", "1" * 100_000], "at most 16,384"),  # the second job's seed: neither starts
        (["00001", "--priority", "99999999999"], "priority 99999999999: at most"),
        (["00001", "--limit", "pages=nan"], "pages=nan: a finite number"),
        (["00001", "--limit", "depth=-1"], "depth=-1.0: a finite number"),
        (["[bold]"], "seed '[bold]' is not valid JSON"),  # quoted as typed, not as markup
    ]
    for args, message in cases:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "celery_crawl.tools.cli",
                "crawl",
                "-A",
                "tasks",
                "forum",
                *args,
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        stderr = " ".join(done.stderr.split())
        assert done.returncode == 2 and message in stderr, stderr[:2000]
        assert len(stderr) < 1_000 and "Traceback" not in stderr
    assert redis.Redis.from_url(db_url).dbsize() == 0
