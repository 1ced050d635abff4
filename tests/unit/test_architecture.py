"""docs/architecture.md against the code: layers, imports, and the names a request's path cites."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import celery_crawl
from celery_crawl.core import scripts

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_crawl"
DOC = (ROOT / "docs" / "architecture.md").read_text()
# third-party frameworks a layer may not import, by layer number
FORBIDDEN = {0: ("twisted", "celery", "kombu"), 1: ("celery", "kombu"), 2: ("celery",)}


def doc_layers() -> dict[str, int]:
    """Package -> layer number, from the doc's table (``| 2 Scrapy side | ... | `a`, `b` |``)."""
    layers = {}
    for number, packages in re.findall(r"^\| (\d) [^|]+\|[^|]+\|([^|]+)\|$", DOC, re.MULTILINE):
        for package in re.findall(r"`(\w+)/`", packages):
            assert package not in layers, f"{package} is in two rows of the layer table"
            layers[package] = int(number)
    return layers


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


def test_every_name_on_the_path_exists() -> None:
    from celery_crawl.app.client import JOB_TASK, PRODUCE_TASK

    names = set(re.findall(r"`(celery_crawl(?:\.\w+)+)`", DOC)) - {JOB_TASK, PRODUCE_TASK}
    assert len(names) > 20
    for name in sorted(names):
        parts = name.split(".")
        for split in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:split]))
            except ImportError:
                continue
            for attribute in parts[split:]:
                obj = getattr(obj, attribute)
            break
        else:
            pytest.fail(f"{name} cannot be imported")


def test_every_lua_file_cited_exists() -> None:
    cited_files = set(re.findall(r"`(\w+/lua/[\w/]+\.lua)`", DOC))
    assert len(cited_files) > 5
    for cited in cited_files:
        assert (PACKAGE / cited).is_file(), cited


@pytest.mark.parametrize("module", library_modules())
def test_the_library_never_imports_the_example_or_the_tests(module: str) -> None:
    used = imports(module_path(module))
    example = {name for name in used if name.split(".")[0] in {"tasks", "tests", "benchmarks"}}
    assert not example, f"celery_crawl.{module} imports {example}"


def test_importing_every_library_module_loads_no_example_module() -> None:
    names = [f"celery_crawl.{module}" for module in library_modules()]
    names += [f"celery_crawl.{module}" for module in settings_paths()]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'tasks', 'tests'}))\n"
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
    assert out.stdout.strip() == "[]"


# scripts run from outside their package today; each is a seam to close, not a rule to keep
CROSSINGS = {
    ("enqueue", "scheduler"),
    ("dedup", "tools"),
}


def script_callers() -> set[tuple[str, str]]:
    """(script, package) for each ``script(client, "NAME")``-style call in the library."""
    calls = set()
    entries = set(scripts.entry_scripts())
    for module in library_modules():
        text = module_path(module).read_text()
        for name in set(re.findall(r"\"(\w+)\"", text)) & entries:
            calls.add((name, module.split(".")[0]))
    return calls


def test_each_script_is_run_by_its_own_package() -> None:
    calls = script_callers()
    assert {name for name, _ in calls} == set(scripts.entry_scripts())  # every script is run
    crossings = {(name, package) for name, package in calls if scripts.owner(name) != package}
    assert crossings == CROSSINGS
