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

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_crawl"
DOC = (ROOT / "docs" / "architecture.md").read_text()
# third-party frameworks a layer may not import, by layer number
FORBIDDEN = {0: ("twisted", "celery", "kombu"), 1: ("celery", "kombu"), 2: ("celery",)}


def doc_layers() -> dict[str, int]:
    """Module -> layer number, from the doc's table (``| 2 Scrapy side | ... | `a`, `b` |``)."""
    layers = {}
    for number, modules in re.findall(r"^\| (\d) [^|]+\|[^|]+\|([^|]+)\|$", DOC, re.MULTILINE):
        for module in re.findall(r"`(\w+)`", modules):
            assert module not in layers, f"{module} is in two rows of the layer table"
            layers[module] = int(number)
    return layers


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            if node.module == "celery_crawl":  # a module, or a name of the public API
                found |= {public_home(alias.name) for alias in node.names}
    return found


def public_home(name: str) -> str:
    """``from celery_crawl import name``: the module ``name`` is, or the one that defines it."""
    if (PACKAGE / f"{name}.py").is_file():
        return f"celery_crawl.{name}"
    return celery_crawl._EXPORTS[name]


def library_modules() -> list[str]:
    return sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def test_the_doc_places_every_module_in_one_layer() -> None:
    assert sorted(doc_layers()) == library_modules()


@pytest.mark.parametrize("module", library_modules())
def test_a_module_imports_only_its_own_layer_and_below(module: str) -> None:
    layers = doc_layers()
    used = imports(PACKAGE / f"{module}.py")
    own = {name.split(".")[1] for name in used if name.startswith("celery_crawl.")}
    above = {name for name in own if layers.get(name, 99) > layers[module]}
    assert not above, f"{module} (layer {layers[module]}) imports a higher layer: {above}"
    banned = FORBIDDEN.get(layers[module], ())
    frameworks = {name for name in used if name.split(".")[0] in banned}
    assert not frameworks, f"{module} (layer {layers[module]}) imports {frameworks}"


def test_every_name_on_the_path_exists() -> None:
    from celery_crawl.client import JOB_TASK, PRODUCE_TASK

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
    for cited in set(re.findall(r"`(lua/[\w/]+\.lua)`", DOC)):
        assert (PACKAGE / cited).is_file(), cited


@pytest.mark.parametrize("module", library_modules())
def test_the_library_never_imports_the_example_or_the_tests(module: str) -> None:
    used = imports(PACKAGE / f"{module}.py")
    example = {name for name in used if name.split(".")[0] in {"tasks", "tests", "benchmarks"}}
    assert not example, f"celery_crawl.{module} imports {example}"


def test_importing_every_library_module_loads_no_example_module() -> None:
    names = [f"celery_crawl.{module}" for module in library_modules()]
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
