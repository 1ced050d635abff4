"""The Lua scripts of every package (``celery_crawl/<package>/lua``), loaded once and
registered per client.

Each script lives beside the module that calls it: ``queue/lua/lease.lua`` is run by
``queue/queues.py``. Two kinds of file, in two folders of a package:

- ``<package>/lua/NAME.lua`` is an entry script, run as ``script(client, "NAME")``. Its
  header lists its KEYS and ARGV and what it returns.
- ``<package>/lua/include/NAME.lua`` is a fragment, never run alone: local functions and
  constants that entry scripts (or other fragments) pull in, from any package. Its header
  says what it defines and what it uses from the including script.

A name is the library's, not a package's: two files of one kind and one name are an error.

Two directives, each a line of its own, put fragments into a script:

- ``--!include NAME`` is replaced by the fragment ``include/NAME.lua``, once per
  script: a fragment already put in further up is not put in again (a fragment
  may include what it uses, and an entry script include it too).
- ``--!slot NAME`` is replaced by the fragment the caller names with the
  keyword argument ``NAME``: the scripts that enqueue take the configured
  dupefilter's fragment as ``dupefilter="dedup_bloom"``.

- ``--!generated MODULE:FUNCTION`` is replaced by the Lua that the Python function
  returns: constants generated from the one Python table both sides share (the job
  states, their counters, the limits' reasons), so that Lua never holds a copy.

Each script's ARGV layout is declared once, beside its caller, as an :class:`Argv`;
the caller builds ARGV from it, and ``tests/unit/core/test_scripts.py`` checks each
layout against the script's header.

A slot is never named like a file, so a slot and a fragment cannot be confused
(``tests/unit/core/test_scripts.py`` checks it). An unknown script or fragment, an
unfilled slot, a keyword no slot takes and an include cycle raise
:class:`~celery_crawl.core.errors.ScriptError`.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from redis.commands.core import Script

from celery_crawl.core.errors import ScriptError

_PACKAGE = resources.files("celery_crawl")
# every package's lua folder
_FOLDERS: list[Traversable] = sorted(
    (folder.joinpath("lua") for folder in _PACKAGE.iterdir() if folder.joinpath("lua").is_dir()),
    key=str,
)
_DIRECTIVE = re.compile(r"^--!(\S*)[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_NAME = re.compile(r"\w+")


def entry_scripts() -> list[str]:
    """The names of the entry scripts, ``<package>/lua/*.lua``."""
    return sorted(files(""))


def fragments() -> list[str]:
    """The names of the fragments, ``<package>/lua/include/*.lua``."""
    return sorted(files("include"))


def owner(name: str) -> str:
    """The package whose ``lua`` folder holds entry script ``name`` (``"queue"`` for lease)."""
    found = files("")
    return Path(str(found[name])).parents[1].name if name in found else ""


def files(sub: str) -> dict[str, Any]:
    """Name -> file, for the ``.lua`` files of every package's ``lua/<sub>``."""
    found: dict[str, Any] = {}
    for folder in _FOLDERS:
        place = folder.joinpath(sub) if sub else folder
        if not place.is_dir():
            continue
        for file in place.iterdir():
            name = file.name.removesuffix(".lua")
            if not file.name.endswith(".lua"):
                continue
            if name in found:
                raise ScriptError(
                    f"two Lua files named {file.name} in lua/{sub}: {found[name]}, {file}"
                )
            found[name] = file
    return found


def slots(name: str) -> list[str]:
    """The slots of entry script ``name`` and of the fragments it includes."""
    found: list[str] = []
    _expand((f"{name}.lua",), None, found, set())
    return sorted(set(found))


@functools.cache
def source(name: str, **fills: str) -> str:
    """Entry script ``name``, each slot filled with the fragment ``fills`` names for it."""
    found: list[str] = []
    text = _expand((f"{name}.lua",), fills, found, set())
    unused = sorted(set(fills) - set(found))
    if unused:
        raise ScriptError(f"{name}.lua has no slot {', '.join(unused)}")
    return text


def _expand(
    chain: tuple[str, ...], fills: dict[str, str] | None, found: list[str], done: set[str]
) -> str:
    """The file ``chain[-1]``, included through ``chain``, with its directives replaced.

    Its slots are appended to ``found``; with ``fills`` None they are left as they are.
    ``done`` holds the fragments already put in: each goes in once.
    """
    if chain[-1] in chain[:-1]:
        raise ScriptError(f"{' > '.join(chain)}: an include cycle")

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "generated":
            return _generated(chain, match.group(2))
        fragment = _fragment(chain, match, fills, found)
        if fragment is None:
            return match.group(0)
        path = f"include/{fragment}.lua"
        if path in done and path not in chain:
            return f"-- {path}: put in further up"
        done.add(path)
        return _expand((*chain, path), fills, found, done)

    return _DIRECTIVE.sub(replace, _read(chain))


def _generated(chain: tuple[str, ...], source: str) -> str:
    """The Lua that ``--!generated MODULE:FUNCTION`` of ``chain[-1]`` stands for."""
    module, _, function = source.partition(":")
    where = " > ".join(chain)
    if not module.startswith("celery_crawl.") or not _NAME.fullmatch(function):
        raise ScriptError(
            f"{where}: --!generated takes celery_crawl.MODULE:FUNCTION, not {source!r}"
        )
    make = getattr(importlib.import_module(module), function, None)
    if make is None:
        raise ScriptError(f"{where}: {module} has no function {function!r} to generate Lua")
    return f"-- generated by {source}\n{make()}"


def lua_value(value: Any) -> str:
    """A Python string, number, bool, tuple or dict as a Lua literal (tuples: sequences)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, tuple | list):
        return "{" + ", ".join(lua_value(item) for item in value) + "}"
    if isinstance(value, dict):
        pairs = (f"[{lua_value(key)}] = {lua_value(item)}" for key, item in value.items())
        return "{" + ", ".join(pairs) + "}"
    raise TypeError(f"no Lua literal for {type(value).__name__}")


def lua_constants(**tables: Any) -> str:
    """``local NAME = <literal>`` lines, one per keyword: what a generating function returns."""
    return "\n".join(f"local {name} = {lua_value(value)}" for name, value in tables.items())


def _fragment(
    chain: tuple[str, ...], match: re.Match[str], fills: dict[str, str] | None, found: list[str]
) -> str | None:
    """The name of the fragment that directive ``match`` of ``chain[-1]`` stands for."""
    directive, name = match.groups()
    if directive == "include":
        return name
    where = " > ".join(chain)
    if directive != "slot":
        raise ScriptError(f"{where}: unknown directive {match.group(0)!r}")
    found.append(name)
    if fills is None:
        return None
    if name not in fills:
        raise ScriptError(f"{where}: slot {name!r} is not filled (pass {name}=<fragment name>)")
    return fills[name]


def _read(chain: tuple[str, ...]) -> str:
    """The text of ``chain[-1]``: an entry script if the chain has only it, else a fragment."""
    path, folder = chain[-1], "include/" if len(chain) > 1 else ""
    name = path.removeprefix(folder).removesuffix(".lua")
    found = files(folder.rstrip("/"))
    if path == f"{folder}{name}.lua" and _NAME.fullmatch(name) and name in found:
        return str(found[name].read_text())
    kind = "fragment" if folder else "entry script"
    where = f"{' > '.join(chain[:-1])}: " if folder else ""
    raise ScriptError(f"{where}no Lua {kind} {name!r} (celery_crawl/<package>/lua/{path})")


LAYOUTS: dict[str, Argv] = {}  # script name -> its declared ARGV layout
# the last ARGV group of a script with a dupefilter slot: the filter's own (its DEDUP_ARGV)
DUPEFILTER_PARAMETERS = ("dupefilter", "parameters")


@dataclass(frozen=True)
class Argv:
    """The ARGV layout of entry script ``script``, declared once, beside its caller.

    ``fields`` are ARGV[1], ARGV[2], ... in order (names of the words of the header's
    ``ARGV[i]`` line); ``groups`` what follows them, in order: each the fields of a
    repeated group (a header ``then ...`` line), its count in a field. ``tail`` is a
    group repeated to ARGV's end, its count in no field (the lease members of an ack):
    after the groups, a header ``ARGV[k..]`` line, or a last ``then ...`` line when
    groups come before it. The caller builds the fixed part with :meth:`build`, one
    group with :meth:`group`, a run of them with :meth:`each` and the tail with
    :meth:`rest`.
    """

    script: str
    fields: tuple[str, ...] = ()
    groups: tuple[tuple[str, ...], ...] = ()
    tail: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if LAYOUTS.setdefault(self.script, self) != self:
            raise ScriptError(f"two ARGV layouts for {self.script}.lua")

    def build(self, **values: Any) -> list[Any]:
        """ARGV's fixed part: a value for each of :attr:`fields`, by name."""
        return self._ordered(self.fields, values)

    def group(self, index: int, **values: Any) -> list[Any]:
        """One repeated group of kind ``index`` of :attr:`groups`, by name."""
        return self._ordered(self.groups[index], values)

    def each(self, index: int, **columns: Sequence[Any]) -> list[Any]:
        """Groups of kind ``index``, one per row: a column of values for each field, by name."""
        return self._rows(self.groups[index], columns)

    def rest(self, **columns: Sequence[Any]) -> list[Any]:
        """The :attr:`tail`, one group per row: a column of values for each field, by name."""
        return self._rows(self.tail, columns)

    def _rows(self, names: tuple[str, ...], columns: dict[str, Sequence[Any]]) -> list[Any]:
        self._ordered(names, columns)
        if len({len(column) for column in columns.values()}) > 1:
            raise ScriptError(f"{self.script}.lua: columns of unequal length for {names}")
        rows = zip(*(columns[name] for name in names), strict=True)
        return [value for row in rows for value in row]

    def _ordered(self, names: tuple[str, ...], values: dict[str, Any]) -> list[Any]:
        return ordered(f"{self.script}.lua", names, values)


def ordered(taker: str, names: tuple[str, ...], values: dict[str, Any]) -> list[Any]:
    """``values`` in the order of ``names``, which they must be exactly: ARGV for ``taker``."""
    if values.keys() != set(names):
        raise ScriptError(f"{taker} takes {', '.join(names) or 'nothing'}: not {', '.join(values)}")
    return [values[name] for name in names]


_registered: dict[tuple[int, str, tuple[tuple[str, str], ...]], Script] = {}


def script(client: Any, name: str, **fills: str) -> Script:
    """The registered script ``name`` for ``client`` (EVALSHA with a load fallback)."""
    key = (id(client), name, tuple(sorted(fills.items())))
    if key not in _registered:
        _registered[key] = client.register_script(source(name, **fills))
    return _registered[key]
