"""docs/architecture.md against the code: layers, imports, and the names a request's path cites."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import celery_crawl
from celery_crawl.core import scripts

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_crawl"
DOC = (ROOT / "docs" / "architecture.md").read_text()
# third-party frameworks a layer may not import, by layer number
FORBIDDEN = {0: ("twisted", "celery", "kombu"), 1: ("celery", "kombu"), 2: ("celery",)}


def doc_table() -> list[tuple[int, str, list[str]]]:
    """The doc's layer table, as (number, name, packages): ``| 2 Scrapy side | ... | `a/` |``."""
    rows = re.findall(r"^\| (\d) ([^|]+)\|[^|]+\|([^|]+)\|$", DOC, re.MULTILINE)
    return [(int(n), name.strip(), re.findall(r"`(\w+)/`", cell)) for n, name, cell in rows]


def doc_layers() -> dict[str, int]:
    """Package -> layer number, from the doc's table."""
    layers: dict[str, int] = {}
    for number, _, names in doc_table():
        for package in names:
            assert package not in layers, f"{package} is in two rows of the layer table"
            layers[package] = number
    return layers


def example_packages() -> set[str]:
    """The packages of the table's ``example`` row: applications built on the library."""
    return {package for _, name, names in doc_table() if name == "example" for package in names}


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            if node.module.startswith("celery_crawl"):  # a module, or a name the package exports
                found |= {public_home(node.module, alias.name) for alias in node.names}
    return found


def public_home(package: str, name: str) -> str:
    """``from package import name``: the module ``name`` is, or the one that defines it."""
    folder = ROOT.joinpath(*package.split("."))
    if (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file():
        return f"{package}.{name}"
    if package == "celery_crawl":
        return celery_crawl._EXPORTS[name]
    return package


def packages() -> list[str]:
    """The library's packages: its folders with an ``__init__.py``."""
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def library_modules() -> list[str]:
    """Every module of the packages, as ``package.module`` (``queue`` for a package's own)."""
    found = []
    for package in packages():
        for path in sorted((PACKAGE / package).glob("*.py")):
            found.append(package if path.stem == "__init__" else f"{package}.{path.stem}")
    return found


def settings_paths() -> list[str]:
    """The top-level modules: each re-exports names users type in settings, and no more."""
    return sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def module_path(module: str) -> Path:
    package, _, name = module.partition(".")
    return PACKAGE / package / f"{name or '__init__'}.py"


def test_the_doc_places_every_package_in_one_layer() -> None:
    assert sorted(doc_layers()) == packages()


def doc_tree() -> dict[str, tuple[int, set[str], set[str]]]:
    """Package -> (layer, modules, entry scripts) as the doc's package tree draws them."""
    block = DOC.split("```text\ncelery_crawl/\n", 1)[1].split("```", 1)[0]
    tree: dict[str, tuple[int, set[str], set[str]]] = {}
    package = ""
    for line in block.splitlines():
        start = re.match(r"^  (\w+)/\s+(\d)\s+(.*)$", line)
        if start:
            package, text = start.group(1), start.group(3)
            tree[package] = (int(start.group(2)), set(), set())
        elif package and line.startswith(" " * 18):
            text = line.strip()
        else:
            package = ""
            continue
        names, _, lua = re.sub(r"\([^)]*\)", "", text).partition("lua:")
        tree[package][1].update(re.findall(r"\b\w+\b", names))
        tree[package][2].update(word for word in lua.split() if re.fullmatch(r"\w+", word))
    return tree


def test_the_doc_draws_each_package_with_its_modules_layer_and_scripts() -> None:
    tree, layers = doc_tree(), doc_layers()
    assert sorted(tree) == packages()
    for package, (layer, modules, lua) in tree.items():
        assert layer == layers[package], f"{package}/: layer {layer} in the tree"
        found = {p.stem for p in (PACKAGE / package).glob("*.py") if p.stem != "__init__"}
        assert modules == found, f"{package}/: the tree draws {sorted(modules)}"
        owned = {name for name in scripts.entry_scripts() if scripts.owner(name) == package}
        assert lua <= owned, f"{package}/: no scripts {sorted(lua - owned)} there"


@pytest.mark.parametrize("module", library_modules())
def test_a_module_imports_only_its_own_layer_and_below(module: str) -> None:
    layers = doc_layers()
    layer = layers[module.split(".", maxsplit=1)[0]]
    used = imports(module_path(module))
    own = {name.split(".")[1] for name in used if name.startswith("celery_crawl.")}
    above = {name for name in own if layers.get(name, 99) > layer}
    assert not above, f"{module} (layer {layer}) imports a higher layer: {above}"
    banned = FORBIDDEN.get(layer, ())
    frameworks = {name for name in used if name.split(".")[0] in banned}
    assert not frameworks, f"{module} (layer {layer}) imports {frameworks}"


@pytest.mark.parametrize("module", library_modules())
def test_no_library_module_imports_a_settings_path(module: str) -> None:
    """The top-level modules are for users' settings; the library imports the code's home."""
    used = imports(module_path(module))
    shims = {f"celery_crawl.{name}" for name in settings_paths()}
    assert not used & shims, f"{module} imports {used & shims}"


def resolve(name: str) -> Any:
    """The object a dotted ``celery_crawl.x.y`` name cites: the longest importable prefix,
    then attributes."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(f"{name} cannot be imported")


def test_every_name_on_the_path_exists() -> None:
    from celery_crawl.app.client import JOB_TASK, PRODUCE_TASK
    from celery_crawl.core.exports import MOVED  # the old paths: test_settings_paths imports them

    names = set(re.findall(r"`(celery_crawl(?:\.\w+)+)`", DOC)) - {JOB_TASK, PRODUCE_TASK}
    names -= set(MOVED)
    assert len(names) > 20
    for name in sorted(names):
        try:
            resolve(name)
        except (ImportError, AttributeError):
            pytest.fail(f"{name} cannot be imported")


def test_every_lua_file_cited_exists() -> None:
    cited_files = set(re.findall(r"`(\w+/lua/[\w/]+\.lua)`", DOC))
    assert len(cited_files) > 5
    for cited in cited_files:
        assert (PACKAGE / cited).is_file(), cited


def test_the_example_layer_is_the_demo_and_the_top_layer() -> None:
    """The forum application the wheel ships for the demo: above every library layer."""
    layers = doc_layers()
    assert example_packages() == {"demo"}
    assert layers["demo"] > max(n for p, n in layers.items() if p not in example_packages())


def is_example(module: str) -> bool:
    return module.split(".", maxsplit=1)[0] in example_packages()


def within(name: str, modules: list[str]) -> bool:
    return any(name == module or name.startswith(f"{module}.") for module in modules)


def example_imports(module: str) -> set[str]:
    """What ``module`` imports of an example or the tests: outside the wheel, and, for a
    library module, the wheel's example layer too."""
    banned = ["tasks", "tests", "benchmarks"]
    if not is_example(module):
        banned += [f"celery_crawl.{package}" for package in example_packages()]
    return {name for name in imports(module_path(module)) if within(name, banned)}


@pytest.mark.parametrize("module", library_modules())
def test_the_library_never_imports_the_example_or_the_tests(module: str) -> None:
    example = example_imports(module)
    assert not example, f"celery_crawl.{module} imports {example}"


def test_importing_every_library_module_loads_no_example_module() -> None:
    """Layers 0 to 4 load neither example; the demo's modules load no ``tasks`` or tests."""
    library = [f"celery_crawl.{m}" for m in library_modules() if not is_example(m)]
    library += [f"celery_crawl.{module}" for module in settings_paths()]
    demo = [f"celery_crawl.{m}" for m in library_modules() if is_example(m)]
    examples = ["tasks", "tests", *(f"celery_crawl.{p}" for p in example_packages())]
    code = (
        "import importlib, sys\n"
        "def loaded(names):\n"
        "    return sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.')"
        " for n in names))\n"
        f"for name in {library!r}: importlib.import_module(name)\n"
        f"print(loaded({examples!r}))\n"
        f"for name in {demo!r}: importlib.import_module(name)\n"
        "print(loaded(['tasks', 'tests']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["[]", "[]"]
    assert demo, "no module of the example layer was imported"


# how the library runs a script by name: scripts.script(client, NAME), a queue's
# self._script(NAME), and the Argv(NAME, ...) declared beside each caller
SCRIPT_CALLS = ("script", "_script", "Argv")


def script_callers() -> set[tuple[str, str]]:
    """(script, package) for each call of :data:`SCRIPT_CALLS` that names a script: found
    by syntax, so that a string such as a stage label or a column name is not a call."""
    calls = set()
    entries = set(scripts.entry_scripts())
    for module in library_modules():
        tree = ast.parse(module_path(module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and called_name(node.func) in SCRIPT_CALLS:
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and arg.value in entries:
                        calls.add((arg.value, module.split(".")[0]))
    return calls


def called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def test_each_script_is_run_by_its_own_package() -> None:
    calls = script_callers()
    assert {name for name, _ in calls} == set(scripts.entry_scripts())  # every script is run
    crossings = {(name, package) for name, package in calls if scripts.owner(name) != package}
    assert crossings == set()


# what Scrapy's engine keeps private, and the attributes through which it is reached
ENGINE_PRIVATE = {
    "_slot",
    "_start",
    "remove_request",
    "nextcall",
    "scraper",
    "itemproc",
    "downloader",
}


def engine_reaches(path: Path) -> list[str]:
    """``x.<private name>`` (not ``self``'s own), ``getattr(x, "<private name>")`` and
    ``setattr(...)`` in ``path``: line and text."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ENGINE_PRIVATE:
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id == "self"):
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            found += [f"{node.lineno}: {what}" for what in reflection(node.func.id, node.args)]
    return found


def reflection(function: str, args: list[ast.expr]) -> list[str]:
    """``setattr`` anything, or ``getattr``/``hasattr`` an engine's private name."""
    if function == "setattr":
        return ["setattr"]
    if function not in ("getattr", "hasattr") or len(args) < 2:
        return []
    name = args[1]
    if isinstance(name, ast.Constant) and name.value in ENGINE_PRIVATE:
        return [f"{function}({name.value!r})"]
    return []


def test_only_the_engine_hooks_reach_into_scrapys_engine() -> None:
    engine = PACKAGE / "scheduler" / "engine.py"
    assert engine_reaches(engine), "the scan finds nothing: ENGINE_PRIVATE is out of date"
    elsewhere = {
        path.relative_to(PACKAGE).as_posix(): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != engine and (found := engine_reaches(path))
    }
    assert not elsewhere


# packages that import each other: none (a cycle would make the folders' layers a lie)
PACKAGE_CYCLES: list[set[str]] = []


def package_graph() -> dict[str, set[str]]:
    """Package -> the other packages its modules import (layers 0-4)."""
    graph: dict[str, set[str]] = {package: set() for package in packages()}
    for module in library_modules():
        package = module.split(".")[0]
        for name in imports(module_path(module)):
            parts = name.split(".")
            if parts[0] == "celery_crawl" and len(parts) > 1 and parts[1] in graph:
                graph[package].add(parts[1])
    for edges in graph.values():
        edges.discard("demo")
    return {package: edges - {package} for package, edges in graph.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for following in graph[todo.pop()] - seen:
            seen.add(following)
            todo.append(following)
    return seen


def test_no_package_cycle_beyond_the_known_ones() -> None:
    graph = package_graph()
    cycles = []
    for package in sorted(graph):
        members = {p for p in reachable(graph, package) if package in reachable(graph, p)}
        if members and members | {package} not in cycles:
            cycles.append(members | {package})
    assert sorted(map(sorted, cycles)) == sorted(map(sorted, PACKAGE_CYCLES))


# -- a request's path, hop by hop ----------------------------------------------


class Hop(NamedTuple):
    """A row of a hop table in the doc's "A request's path": ``| # | from | to | what |``."""

    number: str
    source: str
    target: str
    what: str


def hop_rows() -> list[Hop]:
    """Every hop table's rows: the path's (numbered 1, 2, ...), then the set-up's (S1, ...)."""
    section = DOC.split("## A request's path\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (S?\d+) \| `([^`]+)` \| `([^`]+)` \| (.+) \|$", section, re.MULTILINE)
    return [Hop(*row) for row in rows]


def path_hops() -> list[Hop]:
    return [hop for hop in hop_rows() if not hop.number.startswith("S")]


def is_lua(name: str) -> bool:
    return name.endswith(".lua")


def module_of(name: str) -> str:
    """The module a hop's end is in: a ``.lua`` file, or a Python module."""
    return name if is_lua(name) else resolve(name).__module__


def function_of(name: str) -> Any:
    """The function a dotted name cites (a class's ``__init__`` stands for the class)."""
    obj = resolve(name)
    return obj.__init__ if inspect.isclass(obj) else obj


def last_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def names_used(function: Any) -> set[str]:
    """The names, attributes and strings in a function's body (its own name left out), and
    the scripts of the ``Argv`` layouts it names."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0]
    assert isinstance(body, (ast.FunctionDef, ast.AsyncFunctionDef))
    statements = body.body
    if ast.get_docstring(body) is not None:
        statements = statements[1:]
    used: set[str] = set()
    for node in (n for statement in statements for n in ast.walk(statement)):
        if isinstance(node, ast.Name):
            used.add(node.id)
            layout = function.__globals__.get(node.id)
            if isinstance(layout, scripts.Argv):
                used.add(layout.script)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used.add(node.value)
    return used


def lua_defines(path: str) -> set[str]:
    return set(re.findall(r"^(?:local )?function (\w+)\(", (PACKAGE / path).read_text(), re.M))


def lua_calls(path: str) -> set[str]:
    return set(re.findall(r"\b(\w+)\(", (PACKAGE / path).read_text()))


def scrapy_scheduler_method(name: str) -> bool:
    from scrapy.core.scheduler import BaseScheduler

    return hasattr(BaseScheduler, name)


def scrapy_middleware_method(name: str) -> bool:
    from scrapy.spidermiddlewares.depth import DepthMiddleware

    hooks = {"process_request", "process_response", "process_exception"}
    hooks |= {"process_spider_input", "process_spider_output", "process_spider_exception"}
    return name in hooks or hasattr(DepthMiddleware, name)


def connected_to_a_signal(name: str) -> bool:
    """A handler the library connects to a Scrapy signal (``signals.connect(x.name, ...)``)."""
    found = re.compile(rf"\.connect\(\s*[\w.]*\b{name}\b")
    return any(found.search(path.read_text()) for path in PACKAGE.rglob("*.py"))


def wraps_the_engine_slot(name: str) -> bool:
    """The one patch of Scrapy's engine: its slot's ``remove_request``."""
    from celery_crawl.scheduler.engine import EngineHooks

    return "remove_request" in inspect.getsource(getattr(EngineHooks, name))


def celery_pool_method(name: str) -> bool:
    from celery.concurrency.base import BasePool

    return hasattr(BasePool, name)


def celery_task_body(name: str) -> bool:
    from celery_crawl.app.factory import create_app

    return f"({name})" in inspect.getsource(create_app)


# the hops made through Scrapy or Celery: what calls the ``to`` is theirs, so the ``from``'s
# source does not name it; each is checked by how Scrapy or Celery reaches it instead
THROUGH_FRAMEWORK = {
    (
        "celery_crawl.app.client.crawl",
        "celery_crawl.app.trackers.TrackerPool.apply_async",
    ): celery_pool_method,
    (
        "celery_crawl.app.trackers.TrackerPool._run",
        "celery_crawl.app.tasks.run_job",
    ): celery_task_body,
    (
        "celery_crawl.scheduler.engine.EngineHooks.wake",
        "celery_crawl.scheduler.scheduler.Scheduler.next_request",
    ): scrapy_scheduler_method,
    (
        "celery_crawl.scheduler.scheduler.Scheduler.next_request",
        "celery_crawl.cookies.middleware.SharedCookiesMiddleware.process_request",
    ): scrapy_middleware_method,
    (
        "celery_crawl.cookies.middleware.SharedCookiesMiddleware.process_request",
        "celery_crawl.politeness.middleware.SiteLimitsMiddleware.process_request",
    ): scrapy_middleware_method,
    (
        "celery_crawl.politeness.middleware.SiteLimitsMiddleware.process_request",
        "celery_crawl.hosting.middleware.JobDownloaderMiddleware.process_response",
    ): scrapy_middleware_method,
    (
        "celery_crawl.hosting.middleware.JobDownloaderMiddleware.process_response",
        "celery_crawl.politeness.middleware.SiteLimitsMiddleware.process_response",
    ): scrapy_middleware_method,
    (
        "celery_crawl.politeness.middleware.SiteLimitsMiddleware.process_response",
        "celery_crawl.cookies.middleware.SharedCookiesMiddleware.process_response",
    ): scrapy_middleware_method,
    (
        "celery_crawl.cookies.middleware.SharedCookiesMiddleware.process_response",
        "celery_crawl.jobs.stats.JobStats.on_response",
    ): connected_to_a_signal,
    (
        "celery_crawl.jobs.stats.JobStats.on_response",
        "celery_crawl.hosting.middleware.JobDepthMiddleware.get_processed_request",
    ): scrapy_middleware_method,
    (
        "celery_crawl.hosting.middleware.JobSpiderMiddleware.process_spider_output",
        "celery_crawl.scheduler.scheduler.Scheduler.enqueue_request",
    ): scrapy_scheduler_method,
    (
        "celery_crawl.hosting.middleware.JobSpiderMiddleware._count",
        "celery_crawl.jobs.stats.JobStats.on_items",
    ): connected_to_a_signal,
    (
        "celery_crawl.jobs.stats.JobStats.on_items",
        "celery_crawl.scheduler.engine.EngineHooks.ack_when_done",
    ): wraps_the_engine_slot,
    (
        "celery_crawl.scheduler.participation.Participation._run_hooks",
        "celery_crawl.cookies.middleware.SharedCookiesMiddleware.forget_job",
    ): connected_to_a_signal,
    (
        "celery_crawl.hosting.host.CrawlerHost._open",
        "celery_crawl.scheduler.scheduler.Scheduler.open",
    ): scrapy_scheduler_method,
}


def test_the_hop_total_is_the_number_of_rows() -> None:
    hops = path_hops()
    assert [hop.number for hop in hops] == [str(n) for n in range(1, len(hops) + 1)]
    totals = re.findall(r"^Total: (\d+) hops\.$", DOC, re.MULTILINE)
    assert totals == [str(len(hops))]
    setup = [hop.number for hop in hop_rows() if hop.number.startswith("S")]
    assert setup == [f"S{n}" for n in range(1, len(setup) + 1)]


def test_every_hop_names_code_that_exists() -> None:
    for hop in hop_rows():
        for end in (hop.source, hop.target):
            if is_lua(end):
                assert (PACKAGE / end).is_file(), f"hop {hop.number}: no {end}"
                continue
            try:
                assert callable(resolve(end)), f"hop {hop.number}: {end} is no function"
            except (ImportError, AttributeError):
                pytest.fail(f"hop {hop.number}: {end} cannot be imported")


def test_each_hop_crosses_from_one_module_to_another() -> None:
    for hop in hop_rows():
        assert module_of(hop.source) != module_of(hop.target), f"hop {hop.number}: one module"


def test_each_hop_is_a_call_the_code_makes() -> None:
    """A row's ``from`` calls its ``to`` (or runs its script); made through Scrapy or Celery,
    a callback registered elsewhere, or a message through Redis, the row says so."""
    through = set()
    for hop in hop_rows():
        where = f"hop {hop.number}: {hop.source} -> {hop.target}"
        if (hop.source, hop.target) in THROUGH_FRAMEWORK:
            through.add((hop.source, hop.target))
            assert re.search(r"\b(Scrapy|Celery)", hop.what), f"{where}: say through what"
            assert THROUGH_FRAMEWORK[hop.source, hop.target](last_name(hop.target)), where
        elif is_lua(hop.source):
            check_from_lua(hop, where)
        else:
            check_from_python(hop, where)
    assert through == set(THROUGH_FRAMEWORK), "rows through Scrapy or Celery gone from the doc"


def check_from_python(hop: Hop, where: str) -> None:
    target = Path(hop.target).stem if is_lua(hop.target) else last_name(hop.target)
    registered = re.search(r"a callback, registered by `([\w.]+)`", hop.what)
    caller = registered.group(1) if registered else hop.source
    assert target in names_used(function_of(caller)), f"{where}: {caller} never names {target}"


def check_from_lua(hop: Hop, where: str) -> None:
    if not is_lua(hop.target):  # a script's message, heard by Python code waiting on it
        assert hop.what.startswith("Redis:"), f"{where}: say what Redis carries"
        return
    named = set(re.findall(r"`(\w+)`", hop.what))
    assert named, f"{where}: name the functions of {hop.target} it runs"
    missing = named - (lua_defines(hop.target) & lua_calls(hop.source))
    assert not missing, f"{where}: {sorted(missing)} not defined there and called here"
