"""The Lua folder: every entry script loads on a real server, and the include rules hold."""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from celery_crawl.core import scripts
from celery_crawl.core.errors import ScriptError
from celery_crawl.dupefilter.filters import DUPEFILTER_CLASSES

# what the callers fill each slot with; a new slot needs its fillings here
FILLINGS = {"dupefilter": sorted({cls.lua for cls in DUPEFILTER_CLASSES.values()})}
DIRECTIVE = re.compile(r"^--!(include|slot) (\w+)$", re.MULTILINE)


def every_load() -> Iterator[tuple[str, dict[str, str]]]:
    """Each entry script with no slot once, each one with slots once per filling."""
    for name in scripts.entry_scripts():
        slots = scripts.slots(name)
        for filling in itertools.product(*(FILLINGS.get(slot, []) for slot in slots)):
            yield name, dict(zip(slots, filling, strict=True))


def load_id(load: tuple[str, dict[str, str]]) -> str:
    name, fills = load
    return ",".join([name, *(f"{slot}={fragment}" for slot, fragment in fills.items())])


def directives(kind: str) -> set[str]:
    """The names after every ``--!include`` or ``--!slot`` line of every file."""
    files = [*scripts.files("").values(), *scripts.files("include").values()]
    texts = [file.read_text() for file in files]
    return {name for text in texts for found, name in DIRECTIVE.findall(text) if found == kind}


def header(text: str) -> str:
    """The comment lines a file opens with."""
    return "".join(itertools.takewhile(lambda line: line.startswith("--"), text.splitlines(True)))


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A Lua folder of this test's own, in place of the packages'."""
    (tmp_path / "include").mkdir()
    monkeypatch.setattr(scripts, "_FOLDERS", [tmp_path])
    scripts.source.cache_clear()
    yield tmp_path
    scripts.source.cache_clear()


@pytest.mark.parametrize("load", list(every_load()), ids=load_id)
def test_every_entry_script_loads(client: redis.Redis, load: tuple[str, dict[str, str]]) -> None:
    name, fills = load
    text = scripts.source(name, **fills)
    assert "--!" not in text
    assert client.script_load(text) == hashlib.sha1(text.encode()).hexdigest()


def test_every_slot_has_fillings_and_every_fragment_is_loaded() -> None:
    slots = {slot for name in scripts.entry_scripts() for slot in scripts.slots(name)}
    assert slots == set(FILLINGS)
    filled = {fragment for fillings in FILLINGS.values() for fragment in fillings}
    assert set(scripts.fragments()) == directives("include") | filled


def test_no_name_is_both_a_slot_and_a_file() -> None:
    entries, fragments = set(scripts.entry_scripts()), set(scripts.fragments())
    assert "dedup" in entries and "jobs" in fragments  # the folders are read
    assert not entries & fragments
    assert not directives("slot") & (entries | fragments)


def test_headers() -> None:
    for name in scripts.entry_scripts():
        text = header(scripts.files("")[name].read_text())
        for word in ("KEYS", "ARGV", "Returns"):
            assert word in text, f"{name}.lua: no {word} in its header"
    for name in scripts.fragments():
        text = header(scripts.files("include")[name].read_text())
        for word in ("Uses:", "Defines:"):
            assert word in text, f"include/{name}.lua: no {word} in its header"


@pytest.mark.parametrize("name", ["dedup", "enqueue", "job_start"])
def test_an_unfilled_slot_names_the_script_and_the_slot(name: str) -> None:
    with pytest.raises(ScriptError, match=rf"^{name}\.lua: slot 'dupefilter' is not filled"):
        scripts.source(name)


def test_a_fill_no_slot_takes_is_refused() -> None:
    with pytest.raises(ScriptError, match=r"^ack\.lua has no slot dupefilter$"):
        scripts.source("ack", dupefilter="dedup_exact")


@pytest.mark.parametrize("fragment", ["dedup_nope", "dedup", "../lua/dedup"])
def test_a_slot_takes_only_a_fragment(fragment: str) -> None:
    with pytest.raises(
        ScriptError, match=rf"^enqueue\.lua: no Lua fragment '{re.escape(fragment)}'"
    ):
        scripts.source("enqueue", dupefilter=fragment)


@pytest.mark.parametrize("name", ["jobs", "include/jobs", "nope"])
def test_only_an_entry_script_runs(name: str) -> None:
    with pytest.raises(ScriptError, match=rf"^no Lua entry script '{name}'"):
        scripts.source(name)


def test_an_unknown_include_names_the_files_it_came_through(folder: Path) -> None:
    (folder / "main.lua").write_text("--!include outer\nreturn 1\n")
    (folder / "include" / "outer.lua").write_text("--!include missing\n")
    with pytest.raises(
        ScriptError, match=r"^main\.lua > include/outer\.lua: no Lua fragment 'missing'"
    ):
        scripts.source("main")


def test_an_include_cycle_is_an_error(folder: Path) -> None:
    (folder / "main.lua").write_text("--!include a\nreturn 1\n")
    (folder / "include" / "a.lua").write_text("--!include b\n")
    (folder / "include" / "b.lua").write_text("--!include a\n")
    with pytest.raises(ScriptError, match=r"include/a\.lua > include/b\.lua > include/a\.lua"):
        scripts.source("main")


def test_an_unknown_directive_is_an_error(folder: Path) -> None:
    (folder / "main.lua").write_text("--!inclde a\nreturn 1\n")
    with pytest.raises(ScriptError, match=r"^main\.lua: unknown directive '--!inclde a'"):
        scripts.source("main")


def test_a_slot_in_a_fragment_is_filled_too(folder: Path) -> None:
    (folder / "main.lua").write_text("--!include outer\nreturn f()\n")
    (folder / "include" / "outer.lua").write_text("--!slot kind\n")
    (folder / "include" / "one.lua").write_text("local function f() return 1 end\n")
    assert scripts.slots("main") == ["kind"]
    text = scripts.source("main", kind="one")
    assert text.startswith("local function f() return 1 end\n") and "--!" not in text
    with pytest.raises(ScriptError, match=r"^main\.lua > include/outer\.lua: slot 'kind'"):
        scripts.source("main")


def test_a_script_is_registered_once_per_client_and_filling(client: redis.Redis) -> None:
    exact = scripts.script(client, "enqueue", dupefilter="dedup_exact")
    assert scripts.script(client, "enqueue", dupefilter="dedup_exact") is exact
    assert scripts.script(client, "enqueue", dupefilter="dedup_bloom") is not exact
    assert exact.script == scripts.source("enqueue", dupefilter="dedup_exact")
    assert scripts.source("enqueue", dupefilter="dedup_exact") is scripts.source(
        "enqueue", dupefilter="dedup_exact"
    )


def test_each_name_is_one_file_of_one_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert scripts.owner("lease") == "queue" and scripts.owner("dedup") == "dupefilter"
    for package in ("one", "two"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "same.lua").write_text("return 1\n")
    monkeypatch.setattr(scripts, "_FOLDERS", [tmp_path / "one", tmp_path / "two"])
    with pytest.raises(ScriptError, match=r"two Lua files named same\.lua"):
        scripts.entry_scripts()
