"""The settings registry: every setting the code reads is there, typed, and documented."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from scrapy.settings import BaseSettings, Settings, default_settings

import celery_crawl
from celery_crawl.core import defaults
from celery_crawl.core.defaults import COMMAND, ENVIRONMENT, REFERENCE, SETTINGS, Setting, setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.hosting.host import gc_threshold
from celery_crawl.hosting.project import load_settings
from celery_crawl.scheduler import components

PACKAGE = Path(celery_crawl.__file__).parent
GETTERS = {"get", "getbool", "getint", "getfloat", "getlist", "getdict"}
SCRAPY = {name for name in vars(default_settings) if name.isupper()}
# environment variables the code reads that configure nothing of celery_crawl's
NOT_SETTINGS = {"PYTHONPATH"}


class Read(NamedTuple):
    """One place the code reads a setting or an environment variable."""

    where: str
    name: str
    how: str  # "setting", "direct" (settings.getX / settings[...]) or "env"
    inline_default: bool = False


def is_name(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isupper()


def on_settings(node: ast.expr) -> bool:
    """``settings``, ``crawler.settings``, ``self.settings``: a settings object."""
    return ast.unparse(node).endswith("settings")


def reads_in(source: str, filename: str = "<source>") -> Iterator[Read]:
    """Every settings and environment read in ``source``, found by its syntax."""
    for node in ast.walk(ast.parse(source)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call):
            yield from call_reads(node, where)
        elif isinstance(node, ast.Subscript) and is_name(node.slice):
            name = node.slice.value  # type: ignore[attr-defined]
            if ast.unparse(node.value) == "os.environ":
                yield Read(where, name, "env")
            elif on_settings(node.value):
                yield Read(where, name, "direct")


def call_reads(call: ast.Call, where: str) -> Iterator[Read]:
    func = call.func
    called = ast.unparse(func)
    if called.split(".")[-1] == "setting":
        if len(call.args) != 2 or not is_name(call.args[1]):
            yield Read(where, f"<not a literal: {ast.unparse(call)}>", "setting")
        else:
            yield Read(where, call.args[1].value, "setting")  # type: ignore[attr-defined]
    elif called in ("os.environ.get", "os.getenv") and call.args and is_name(call.args[0]):
        yield Read(where, call.args[0].value, "env")  # type: ignore[attr-defined]
    elif (
        isinstance(func, ast.Attribute)
        and func.attr in GETTERS
        and on_settings(func.value)
        and call.args
        and is_name(call.args[0])
    ):
        name = call.args[0].value  # type: ignore[attr-defined]
        yield Read(where, name, "direct", len(call.args) > 1 or bool(call.keywords))
    for keyword in call.keywords:
        if keyword.arg == "envvar" and is_name(keyword.value):
            yield Read(where, keyword.value.value, "env")  # type: ignore[attr-defined]


def package_reads() -> list[Read]:
    """The library's reads; the example (``demo/``) reads its own application settings."""
    reads = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name.startswith("demo/"):
            continue
        reads += reads_in(path.read_text(encoding="utf-8"), name)
    return reads


READS = package_reads()


def test_the_scan_finds_reads_of_every_form() -> None:
    source = """
value = setting(crawler.settings, "NOT_REGISTERED")
other = self.settings.getint("ALSO_NOT", 3)
third = settings["THIRD"]
url = os.environ.get("SOME_VAR")
computed = setting(settings, name)
request.meta.get("NOT_A_SETTING_READ")
"""
    found = {(r.name, r.how, r.inline_default) for r in reads_in(source)}
    assert found == {
        ("NOT_REGISTERED", "setting", False),
        ("ALSO_NOT", "direct", True),
        ("THIRD", "direct", False),
        ("SOME_VAR", "env", False),
        ("<not a literal: setting(settings, name)>", "setting", False),
    }
    modules = {r.where.split(":")[0] for r in READS}
    assert {
        "scheduler/config.py",
        "app/factory.py",
        "hosting/host.py",
        "core/keys.py",
        "core/connection.py",
    } <= modules


def test_every_setting_the_code_reads_is_registered() -> None:
    unknown = [
        f"{r.where}: {r.name}"
        for r in READS
        if r.how != "env" and r.name not in SETTINGS and r.name not in SCRAPY
    ]
    assert not unknown, (
        "settings read but not registered in celery_crawl/core/defaults.py (nor Scrapy's):\n"
        + "\n".join(unknown)
    )


def test_setting_reads_name_scrapy_settings_not_environment_variables() -> None:
    wrong = [
        f"{r.where}: {r.name}"
        for r in READS
        if r.how == "setting" and not (r.name in SETTINGS and SETTINGS[r.name].scrapy)
    ]
    assert not wrong, (
        "setting() needs a literal name of a registered Scrapy setting:\n" + "\n".join(wrong)
    )


def test_registered_settings_are_read_through_setting_without_inline_defaults() -> None:
    direct = [f"{r.where}: {r.name}" for r in READS if r.how == "direct" and r.name in SETTINGS]
    assert not direct, "read these with celery_crawl.core.defaults.setting():\n" + "\n".join(direct)
    inline = [f"{r.where}: {r.name}" for r in READS if r.inline_default and r.name in SCRAPY]
    assert not inline, "Scrapy's settings keep Scrapy's defaults:\n" + "\n".join(inline)


def test_every_environment_variable_the_code_reads_is_registered() -> None:
    unknown = [
        f"{r.where}: {r.name}"
        for r in READS
        if r.how == "env" and r.name not in SETTINGS and r.name not in NOT_SETTINGS
    ]
    assert not unknown, "environment variables missing from celery_crawl/core/defaults.py:\n" + (
        "\n".join(unknown)
    )


def test_unknown_settings_raise_key_error() -> None:
    with pytest.raises(KeyError, match=r"'SCHEDULER_PERSISTS' is not a celery_crawl setting"):
        setting(Settings(), "SCHEDULER_PERSISTS")
    with pytest.raises(KeyError, match="did you mean SCHEDULER_PERSIST"):
        setting(Settings(), "SCHEDULER_PERSISTS")
    with pytest.raises(KeyError, match="register it"):
        setting(Settings(), "SPIDER_MODULES")  # Scrapy's: read it as Scrapy does
    with pytest.raises(KeyError, match="environment variable, not a Scrapy setting"):
        setting(Settings(), "CELERY_BROKER_URL")


def test_values_from_the_environment_come_back_typed() -> None:
    settings = Settings(
        {
            "SCHEDULER_PERSIST": "false",
            "CELERY_CRAWL_GC_FREEZE": "0",
            "SCHEDULER_FLUSH_ON_START": "True",
            "SCHEDULER_LEASE_SECONDS": "0.5",
            "SCHEDULER_PREFETCH": "3",
            "PRODUCER_SOURCES": "a,b",
            "CELERY_CRAWL_SPIDERS": "",
            "CELERY_CRAWL_QUEUES": '{"forum": "forum.list"}',
            "REDIS_PORT": "7000",
            "CELERY_CRAWL_KEY_PREFIX": "proj",
        }
    )
    assert setting(settings, "SCHEDULER_PERSIST") is False
    assert setting(settings, "CELERY_CRAWL_GC_FREEZE") is False
    assert setting(settings, "SCHEDULER_FLUSH_ON_START") is True
    assert setting(settings, "SCHEDULER_LEASE_SECONDS") == 0.5
    assert setting(settings, "SCHEDULER_PREFETCH") == 3
    assert setting(settings, "PRODUCER_SOURCES") == ["a", "b"]
    assert setting(settings, "CELERY_CRAWL_SPIDERS") == []
    assert setting(settings, "CELERY_CRAWL_QUEUES") == {"forum": "forum.list"}
    assert setting(settings, "REDIS_PORT") == 7000
    assert setting(settings, "CELERY_CRAWL_KEY_PREFIX") == "proj"
    with pytest.raises(ValueError):
        setting(Settings({"SCHEDULER_PERSIST": "maybe"}), "SCHEDULER_PERSIST")


def test_the_environment_reaches_hosted_settings_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_CRAWL_KEY_PREFIX", "from-env")
    monkeypatch.setenv("REDIS_URL", "redis://env-host:6400/3")
    settings = load_settings(None)
    assert setting(settings, "CELERY_CRAWL_KEY_PREFIX") == "from-env"
    assert setting(settings, "REDIS_URL") == "redis://env-host:6400/3"
    assert setting(settings, "SCHEDULER_PERSIST") is True  # the hosted value


@pytest.mark.parametrize("empty", [BaseSettings(), {}], ids=["scrapy", "mapping"])
def test_defaults_apply_where_settings_never_saw_them(empty: Any) -> None:
    for name, entry in SETTINGS.items():
        if not entry.scrapy:
            continue
        value = setting(empty, name)
        expected = {list: list, dict: dict}.get(entry.type, lambda v: v)(entry.default)
        assert value == expected, name
        assert value is None or type(value) is entry.type, name


def test_a_plain_scrapy_crawl_gets_celery_crawl_components() -> None:
    # Scrapy's settings hold Scrapy's dupefilter, which means ours
    assert components.dupefilter_class(Settings()).__name__ == "RFPDupeFilter"
    assert components.dupefilter_class(Settings()).__module__ == "celery_crawl.dupefilter.filters"
    assert components.queue_class(Settings()).__name__ == "PriorityQueue"


def test_values_handed_out_are_copies() -> None:
    params = setting(BaseSettings(), "REDIS_PARAMS")
    params["socket_timeout"] = 1
    assert setting(BaseSettings(), "REDIS_PARAMS")["socket_timeout"] != 1
    with pytest.raises(TypeError):
        SETTINGS["REDIS_PARAMS"].default["socket_timeout"] = 1


def test_scrapy_settings_are_registered_only_to_change_their_default() -> None:
    shadowed = {name for name in SETTINGS if name in SCRAPY}
    assert shadowed == {"DUPEFILTER_CLASS"}
    for name in shadowed:
        assert SETTINGS[name].default != getattr(default_settings, name)


def test_every_entry_is_typed_documented_and_in_a_section() -> None:
    assert list(SETTINGS) == [s.name for s in SETTINGS.values()]
    for entry in SETTINGS.values():
        assert entry.type in (bool, int, float, str, list, dict)
        assert entry.meaning and entry.section in defaults.SECTIONS
    sections = [s.section for s in SETTINGS.values()]
    assert sections == sorted(sections, key=defaults.SECTIONS.index)  # the reference's order
    assert {s.name for s in SETTINGS.values() if s.section == ENVIRONMENT} == {
        "CELERY_BROKER_URL",
        "CELERY_RESULT_BACKEND",
        "CELERY_CRAWL_APP",
    }


def test_malformed_entries_are_refused() -> None:
    with pytest.raises(ValueError, match="give a type"):
        Setting("NO_TYPE", None, "meaning", defaults.REDIS)
    with pytest.raises(ValueError, match="is not a int"):
        Setting("WRONG_TYPE", "1", "meaning", defaults.REDIS, int)
    with pytest.raises(ValueError, match="is not a int"):
        Setting("BOOL_IS_NOT_INT", True, "meaning", defaults.REDIS, int)
    with pytest.raises(ValueError, match="one line"):
        Setting("TWO_LINES", 1, "one\ntwo", defaults.REDIS)
    with pytest.raises(ValueError, match="UPPER_CASE"):
        Setting("lower", 1, "meaning", defaults.REDIS)
    with pytest.raises(ValueError, match="section"):
        Setting("NO_SECTION", 1, "meaning", "Elsewhere")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("5000,20,10", (5000, 20, 10)), (" 900 ", (900,)), ("", ()), ([1000, 5], (1000, 5))],
)
def test_the_gc_threshold_is_read_as_integers(value: Any, expected: tuple[int, ...]) -> None:
    settings = Settings({"CELERY_CRAWL_GC_THRESHOLD": value})
    assert gc_threshold(settings) == expected
    assert gc_threshold(Settings()) == (5000, 20, 10)


@pytest.mark.parametrize("value", ["0", "5000,-1", "many", "1,2,3,4", "1.5"])
def test_a_gc_threshold_python_would_refuse_or_misread_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="give 1 to 3 positive integers"):
        gc_threshold(Settings({"CELERY_CRAWL_GC_THRESHOLD": value}))


def test_the_reference_is_generated_from_the_registry() -> None:
    text = defaults.render()
    for entry in SETTINGS.values():
        assert f"| `{entry.name}` | `{defaults.literal(entry.default)}` |" in text
    committed = REFERENCE.read_text(encoding="utf-8") if REFERENCE.is_file() else ""
    assert committed == text, f"docs/settings.md is out of date: run `{COMMAND}`"
    assert defaults.main(["--check"]) == 0


@pytest.mark.slow  # a fresh interpreter: this process has loaded everything already
def test_the_registry_and_the_package_import_nothing_heavy() -> None:
    code = (
        "import sys, celery_crawl, celery_crawl.core.defaults, celery_crawl.core.errors\n"
        "heavy = [m for m in ('scrapy', 'celery', 'redis', 'twisted') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    root = str(PACKAGE.parent)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)
