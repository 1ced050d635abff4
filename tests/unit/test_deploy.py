"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

The file is parsed, and every service's command is checked against what this
checkout really provides: Celery app modules that import, Celery subcommands
that exist, and ``celery-crawl`` subcommands of the real CLI.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from tests.support import ROOT

CELERY_BUILTINS = {"worker", "beat", "events", "inspect", "control", "call", "status", "shell"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def command(service: dict[str, Any]) -> list[str]:
    value = service["command"]
    return value if isinstance(value, list) else value.split()


def app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run this project's image."""
    return {name: s for name, s in compose["services"].items() if s.get("build") == "."}


def test_the_deployment_has_every_service(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {
        *("redis", "worker", "beat", "flower", "exporter", "demo", "prometheus", "grafana")
    }
    assert services["demo"]["profiles"] == ["demo"]
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["monitoring"]
    assert "container_name" not in compose["services"]["worker"]  # --scale worker=N


def test_redis_and_every_app_service_come_back_after_an_exit(compose: dict[str, Any]) -> None:
    """A worker exits on purpose (a crawler that cannot open again: exit 70), and Celery's
    main process can stop on a broker outage (docs/deployment.md): the policy restarts it."""
    services = {"redis": compose["services"]["redis"], **app_services(compose)}
    assert {"worker", "beat", "flower", "exporter", "demo"} <= set(services)
    assert {name: s.get("restart") for name, s in services.items()} == {
        name: "unless-stopped" for name in services
    }


def test_celery_commands_name_modules_and_subcommands_that_exist(compose: dict[str, Any]) -> None:
    subcommands = CELERY_BUILTINS | {ep.name for ep in entry_points(group="celery.commands")}
    checked = 0
    for name, service in app_services(compose).items():
        args = command(service)
        if args[0] != "celery":
            continue
        app_module = args[args.index("-A") + 1]
        app = importlib.import_module(app_module).app
        assert app.main == app_module, name
        assert args[args.index("-A") + 2] in subcommands, name
        checked += 1
    assert checked == 3  # worker, beat, flower


def test_celery_crawl_commands_exist_in_the_cli(compose: dict[str, Any]) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    target = scripts["celery-crawl"]
    module, attr = target.split(":")
    cli = typer.main.get_command(importlib.import_module(module).cli)
    assert attr == "main"
    checked = [
        command(s) for s in app_services(compose).values() if command(s)[0] == "celery-crawl"
    ]
    assert len(checked) == 2  # the exporter and the demo site
    for args in checked:  # built in, or added by an entry point (the demo site)
        assert cli.get_command(typer.Context(cli), args[1]) is not None  # type: ignore[attr-defined]


def test_redis_is_not_published_and_is_persistent_with_a_password(
    compose: dict[str, Any],
) -> None:
    redis_service = compose["services"]["redis"]
    assert "ports" not in redis_service
    assert redis_service["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert "6379" not in str(port), name
    url = app_services(compose)["worker"]["environment"]["REDIS_URL"]
    assert re.fullmatch(r"redis://:\$\{REDIS_PASSWORD[^}]*\}@redis:6379/0", url)


def run_redis_command(
    compose: dict[str, Any], tmp_path: Path, password: str
) -> subprocess.CompletedProcess[str]:
    """The service's shell line, run with stand-ins for the image's entrypoint and chown."""
    shell, flag, script = command(compose["services"]["redis"])
    assert (shell, flag) == ("sh", "-c")
    for stub, body in {
        "docker-entrypoint.sh": 'echo "$@" > argv; cp "$2" conf',
        "chown": "true",
    }.items():
        (tmp_path / stub).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / stub).chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "REDIS_PASSWORD": password}
    script = script.replace("$$", "$")  # what compose hands the shell
    script = script.replace("/tmp/auth.conf", str(tmp_path / "auth.conf"))  # the test's own
    return subprocess.run(
        [shell, flag, script],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_redis_starts_with_its_password_from_a_file_not_from_argv(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    assert run_redis_command(compose, tmp_path, "s3cr3t-pw").returncode == 0
    argv = (tmp_path / "argv").read_text().split()
    assert argv == [
        *("valkey-server", str(tmp_path / "auth.conf")),
        *("--appendonly", "yes", "--appendfsync", "everysec"),
    ]
    assert (tmp_path / "conf").read_text() == 'requirepass "s3cr3t-pw"\n'


@pytest.mark.parametrize("password", ['pa"ss', "pa\\ss", "p@ss", "pa ss", "pa/ss", "pa:ss"])
def test_a_password_that_would_break_the_config_or_the_url_is_refused_by_name(
    compose: dict[str, Any], tmp_path: Path, password: str
) -> None:
    """A quote or backslash breaks valkey's config line; ``@ / :`` break REDIS_URL."""
    done = run_redis_command(compose, tmp_path, password)
    assert done.returncode == 78
    assert "REDIS_PASSWORD may hold only" in done.stderr
    assert not (tmp_path / "argv").exists()  # valkey never started
    assert not (tmp_path / "auth.conf").exists()


def test_flower_asks_for_a_password_and_listens_on_loopback_only(compose: dict[str, Any]) -> None:
    flower = compose["services"]["flower"]
    auth = flower["environment"]["FLOWER_BASIC_AUTH"]  # Flower reads FLOWER_* variables
    assert auth == "${FLOWER_BASIC_AUTH:?set FLOWER_BASIC_AUTH=user:password}"
    assert (
        flower["environment"]["REDIS_URL"]
        == app_services(compose)["worker"]["environment"]["REDIS_URL"]
    )
    assert all(str(port).startswith("127.0.0.1:") for port in flower["ports"])


# a variable that compose puts into the text (``$$`` is a literal ``$``, left to the shell)
SECRET_VARIABLE = re.compile(r"(?<!\$)\$\{?\w*(PASSWORD|AUTH|SECRET|TOKEN)", re.IGNORECASE)
SECRET_FLAG = re.compile(r"--(basic-auth|requirepass|password|pass)\b")


def test_no_secret_is_on_a_command_line(compose: dict[str, Any]) -> None:
    """``ps`` shows every process's argv to every user of the host: secrets go in the env."""
    for name, service in compose["services"].items():
        argv = [*command(service)] if "command" in service else []
        argv += service.get("healthcheck", {}).get("test", [])
        for arg in map(str, argv):
            assert not SECRET_VARIABLE.search(arg), (name, arg)
            assert not SECRET_FLAG.search(arg), (name, arg)


def test_the_docs_put_no_secret_on_a_command_line() -> None:
    given = re.compile(SECRET_FLAG.pattern + r"[= ]+[^\s`]")  # the flag with a value
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert not given.search(page.read_text()), page.name


def test_monitoring_mounts_files_that_exist(compose: dict[str, Any]) -> None:
    mounts = [
        volume.split(":")[0]
        for name in ("prometheus", "grafana")
        for volume in compose["services"][name]["volumes"]
    ]
    assert len(mounts) == 4 and all((ROOT / path).exists() for path in mounts)


def test_the_dockerfile_copies_what_exists_and_installs_flower() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    copied = [word for line in lines if line.startswith("COPY") for word in line.split()[1:-1]]
    assert copied and all((ROOT / path).exists() for path in copied)
    assert "tasks" in copied and "celery_crawl" in copied
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "flower" in extras["optional-dependencies"]
    installs = [i for i, line in enumerate(lines) if "pip install --no-cache-dir" in line]
    code = min(i for i, line in enumerate(lines) if line.startswith("COPY celery_crawl"))
    # the dependencies from pyproject.toml alone, then the code without them
    assert installs[0] < code < installs[-1], lines
    assert '".[flower]"' in lines[installs[0]] and "--no-deps" in lines[installs[-1]]
