"""The Lua folder: every entry script loads on a real server, and the include rules hold."""

from __future__ import annotations

import hashlib
import importlib
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


# -- ARGV layouts, declared once beside each caller -----------------------------------

# entry scripts whose ARGV layout is not declared yet (the dedup kinds' own scripts)
UNDECLARED = {"dedup", "repair", "spider_size"}
TAG = re.compile(r"^-- ?(KEYS|ARGV|Returns|Slot|then)\b")


# the modules that run the scripts: importing them declares the layouts
CALLERS = (
    "celery_crawl.cookies.store",
    "celery_crawl.hosting.registry",
    "celery_crawl.jobs.store",
    "celery_crawl.politeness.robots",
    "celery_crawl.politeness.sites",
    "celery_crawl.producer.producer",
    "celery_crawl.producer.schedule",
    "celery_crawl.queue.queues",
    "celery_crawl.scheduler.crawl_state",
    "celery_crawl.stats.collector",
)


def layouts() -> dict[str, scripts.Argv]:
    """Every declared layout: importing the callers declares them."""
    for module in CALLERS:
        importlib.import_module(module)
    return dict(scripts.LAYOUTS)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def in_order(wanted: list[str], text: str) -> bool:
    """Whether ``wanted`` are words of ``text``, in that order."""
    found = iter(words(text))
    return all(word in found for word in wanted)


def header_parts(name: str) -> tuple[dict[int, str], list[str]]:
    """A script header's ``ARGV[i]`` lines by i, and its ``then ...`` paragraphs and
    ``ARGV[k..]`` tail, in order (a tail's k is checked: the first after the fixed part)."""
    fixed: dict[int, str] = {}
    groups: list[str] = []
    current: list[str] | None = None
    for line in header(scripts.files("")[name].read_text()).splitlines():
        tag = TAG.match(line)
        single = re.match(r"^-- ARGV\[(\d+)\]\s+(.*)$", line)
        tail = re.match(r"^-- ARGV\[(\d+)\.\.\]\s+(.*)$", line)
        if single:
            fixed[int(single.group(1))] = single.group(2)
        current = None if tag else current
        if tail:
            assert not groups and int(tail.group(1)) == len(fixed) + 1, f"{name}.lua: {line}"
        if tail or (tag and tag.group(1) == "then"):
            groups.append(line)
            current = groups
        elif current is not None and re.match(r"^--\s{2,}\S", line):
            groups[-1] += " " + line
    return fixed, groups


def test_every_entry_script_outside_the_undeclared_has_one_layout() -> None:
    declared = set(layouts())
    assert declared <= set(scripts.entry_scripts())
    assert set(scripts.entry_scripts()) - declared == UNDECLARED


@pytest.mark.parametrize("name", sorted(layouts()))
def test_a_layout_matches_its_script_header(name: str) -> None:
    layout = layouts()[name]
    fixed, groups = header_parts(name)
    assert sorted(fixed) == list(range(1, len(layout.fields) + 1)), f"{name}.lua's ARGV[i]"
    for index, field in enumerate(layout.fields, 1):
        assert in_order(field.split("_"), fixed[index]), f"{name}.lua ARGV[{index}] is not {field}"
    declared = [*layout.groups, *([layout.tail] if layout.tail else [])]
    assert len(groups) == len(declared), f"{name}.lua's 'then' groups and ARGV[k..] tail"
    for group, text in zip(declared, groups, strict=True):
        wanted = [word for field in group for word in field.split("_")]
        assert in_order(wanted, text), f"{name}.lua: {text!r} is not {group}"


def test_a_layout_takes_its_fields_by_name_and_no_others() -> None:
    close = layouts()["job_end"]
    assert close.build(reason="r", job_id="j") == ["j", "r"]
    with pytest.raises(ScriptError, match=r"^job_end\.lua takes job_id, reason: not job_id$"):
        close.build(job_id="j")
    with pytest.raises(ScriptError, match=r"two ARGV layouts for job_end\.lua"):
        scripts.Argv("job_end", ("job_id",))


def test_groups_and_a_tail_take_their_columns_by_name() -> None:
    write = layouts()["cookies_write"]
    assert write.each(0, json=["1", "2"], field=["a", "b"]) == ["a", "1", "b", "2"]
    assert write.rest(fields_to_delete=("x", "y")) == ["x", "y"]
    assert layouts()["ack"].rest(lease_members=[]) == []
    with pytest.raises(ScriptError, match=r"columns of unequal length"):
        write.each(0, field=["a", "b"], json=["1"])
    with pytest.raises(ScriptError, match=r"^cookies_write\.lua takes fields_to_delete: not"):
        write.rest(field=["a"])


def test_an_entry_builds_its_arguments_in_the_declared_order() -> None:
    from celery_crawl.core.entries import ENTRY_ARGV, Entry

    entry = Entry(b"payload", 7, b"fp", "job-1", "example.com")
    expected = {
        "priority": 7,
        "fingerprint": b"fp",
        "job_id": "job-1",
        "payload": b"payload",
        "lane": 2,
        "site": "example.com",
    }
    assert dict(zip(ENTRY_ARGV, entry.args(True, 2), strict=True)) == expected
    assert layouts()["enqueue"].groups[0] == layouts()["job_start"].groups[0] == ENTRY_ARGV


# -- tables Lua shares with Python, generated from the Python side ---------------------


def test_generated_tables_are_what_python_holds(client: redis.Redis, folder: Path) -> None:
    from celery_crawl.jobs import limits, store

    (folder / "main.lua").write_text(
        "--!generated celery_crawl.jobs.store:lua_tables\n"
        "local final, limited = {}, {}\n"
        "for state in pairs(FINAL) do final[#final + 1] = state end\n"
        "for name, reason in pairs(LIMITED) do limited[#limited + 1] = name .. '=' .. reason end\n"
        "table.sort(final)\n"
        "table.sort(limited)\n"
        "return {final, JOB_COUNTERS, limited}\n"
    )
    final, counters, limited = client.eval(scripts.source("main"), 0)
    assert [state.decode() for state in final] == sorted(store.TERMINAL_STATES)
    assert [counter.decode() for counter in counters] == list(store.COUNTERS)
    reasons = {f"{name}={limits.LIMITS[name].reason}" for name in limits.COUNTED}
    assert [pair.decode() for pair in limited] == sorted(reasons)


def test_no_lua_file_holds_a_copy_of_a_python_table() -> None:
    from celery_crawl.core import keys
    from celery_crawl.dupefilter import keys as dedup_keys
    from celery_crawl.jobs import limits, store

    copies = [limit.reason for limit in limits.LIMITS.values() if limit.reason]
    copies += [f"{state} = true" for state in store.TERMINAL_STATES]
    copies += ["'" + "', '".join(store.COUNTERS[:3])]
    job_keys = (keys.JOB_PARTICIPANTS, keys.JOB_DONE, keys.JOB_SEEN, keys.JOB_STATES)
    copies += [f"'{suffix}'" for suffix in (*job_keys, keys.ACTIVE_JOBS, keys.JOB_ENDED)]
    queue_keys = (keys.PARKED, keys.SIGNAL, keys.SITE_LEASES, keys.SITE_WAITING)
    copies += [f"'{suffix}" for suffix in (*queue_keys, keys.SITE_KNOWN, keys.SITE_LIMITS)]
    copies += [f"'{keys.STATS_RATE}'"]
    dedup = [value for name, value in vars(dedup_keys).items() if name.startswith("DEDUP_")]
    copies += [f"':{part}" for part in (keys.DEDUP_COUNT, *dedup) if isinstance(part, str)]
    files = [*scripts.files("").values(), *scripts.files("include").values()]
    for file in files:
        text = re.sub(r"--.*", "", file.read_text())  # the code: comments may name them
        held = [copy for copy in copies if copy in text]
        assert not held, f"{file}: {held}, generated from Python instead (--!generated)"


def test_the_generated_job_keys_are_those_python_names(client: redis.Redis, folder: Path) -> None:
    from celery_crawl.core.keys import SpiderKeys

    keys = SpiderKeys.build("spider", prefix="p")
    (folder / "main.lua").write_text(
        "local JOB_PREFIX = KEYS[1]\n"
        "--!generated celery_crawl.core.keys:lua_job_keys\n"
        "return {job_participants_key('j'), job_done_key('j'), job_seen_key('j'),"
        " JOB_STATES_KEY, ACTIVE_JOBS_KEY, job_ended_key('s')}\n"
    )
    found = client.eval(scripts.source("main"), 1, keys.job_prefix)
    expected = [keys.job_participants("j"), keys.job_done("j"), keys.job_seen("j")]
    expected += [keys.job_states, keys.active_jobs, keys.job_ended("s")]
    assert [key.decode() for key in found] == expected


def test_the_generated_queue_and_site_keys_are_those_python_names(
    client: redis.Redis, folder: Path
) -> None:
    from celery_crawl.core.keys import SpiderKeys

    keys = SpiderKeys.build("spider", prefix="p")
    (folder / "main.lua").write_text(
        "local levels, sites = KEYS[1], KEYS[2]\n"
        "--!generated celery_crawl.core.keys:lua_queue_keys\n"
        "return {level_key(levels, -3), parked_key(levels), site_parked_key(levels, 's'),"
        " level_key(site_parked_key(levels, 's'), 2), signal_key(levels), site_key(sites, 's'),"
        " site_leases_key(sites, 's'), site_waiting_key(sites, 's'), site_known_key(sites),"
        " site_limits_key(sites)}\n"
    )
    found = client.eval(scripts.source("main"), 2, keys.queue, keys.site_prefix)
    expected = [keys.level(-3), keys.parked, keys.site_parked("s")]
    expected += [keys.site_parked("s") + ":2", keys.signal, keys.site("s")]
    expected += [keys.site_leases("s"), keys.site_waiting("s"), keys.site_known, keys.site_limits]
    assert [key.decode() for key in found] == expected


def test_the_generated_stats_rate_key_is_the_one_python_names(
    client: redis.Redis, folder: Path
) -> None:
    from celery_crawl.core.keys import SpiderKeys

    keys = SpiderKeys.build("spider", prefix="p")
    (folder / "main.lua").write_text(
        "--!generated celery_crawl.core.keys:lua_stats_keys\n"
        "return stats_rate_key(KEYS[1], 29412345)\n"
    )
    assert client.eval(scripts.source("main"), 1, keys.stats).decode() == keys.stats_rate(29412345)


def test_a_generated_directive_names_a_library_function(folder: Path) -> None:
    (folder / "main.lua").write_text("--!generated os:getcwd\nreturn 1\n")
    with pytest.raises(ScriptError, match=r"^main\.lua: --!generated takes celery_crawl\."):
        scripts.source("main")
    (folder / "main.lua").write_text("--!generated celery_crawl.jobs.store:nope\nreturn 1\n")
    with pytest.raises(ScriptError, match=r"celery_crawl\.jobs\.store has no function 'nope'"):
        scripts.source("main")
