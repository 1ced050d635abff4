"""Names a package re-exports from its modules, loaded when first used, and the modules
that moved when the library became a package per concept.

A package whose name users type in settings (``celery_crawl.queue.PriorityQueue``)
re-exports its public classes lazily, so that importing one of its modules does not
load the others, and no import cycle can form through the package itself.

:data:`MOVED` is the one table of old module paths: ``import celery_crawl.project``
still works, with a :class:`DeprecationWarning` naming the new home, and logging
configuration that named an old module names the new one (a module's logger is named
after it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# old module path -> where its code lives now (an old path that is still a module,
# a package or a settings path, is not listed: it imports as it is)
MOVED = {
    "celery_crawl.errors": "celery_crawl.core.errors",
    "celery_crawl.bad_values": "celery_crawl.core.bad_values",
    "celery_crawl.defaults": "celery_crawl.core.defaults",
    "celery_crawl.keys": "celery_crawl.core.keys",
    "celery_crawl.scripts": "celery_crawl.core.scripts",
    "celery_crawl.compat": "celery_crawl.core.compat",
    "celery_crawl.repair": "celery_crawl.core.repair",
    "celery_crawl.heartbeat": "celery_crawl.core.heartbeat",
    "celery_crawl.notices": "celery_crawl.core.notices",
    "celery_crawl.serializer": "celery_crawl.codec.serializer",
    "celery_crawl.tags": "celery_crawl.codec.tags",
    "celery_crawl.inputs": "celery_crawl.jobs.inputs",
    "celery_crawl.sites": "celery_crawl.politeness.sites",
    "celery_crawl.cookie_store": "celery_crawl.cookies.store",
    "celery_crawl.buffer": "celery_crawl.scheduler.buffer",
    "celery_crawl.prefetch": "celery_crawl.scheduler.prefetch",
    "celery_crawl.engine": "celery_crawl.scheduler.engine",
    "celery_crawl.routing": "celery_crawl.scheduler.routing",
    "celery_crawl.participation": "celery_crawl.scheduler.participation",
    "celery_crawl.crawl_limits": "celery_crawl.scheduler.crawl_limits",
    "celery_crawl.crawl_state": "celery_crawl.scheduler.crawl_state",
    "celery_crawl.components": "celery_crawl.scheduler.components",
    "celery_crawl.project": "celery_crawl.hosting.project",
    "celery_crawl.registry": "celery_crawl.hosting.registry",
    "celery_crawl.celery_tasks": "celery_crawl.app.tasks",
    "celery_crawl.worker": "celery_crawl.app.worker",
    "celery_crawl.trackers": "celery_crawl.app.trackers",
    "celery_crawl.broker": "celery_crawl.app.broker",
    "celery_crawl.client": "celery_crawl.app.client",
    "celery_crawl.cli": "celery_crawl.tools.cli",
    "celery_crawl.status": "celery_crawl.tools.status",
    "celery_crawl.exporter": "celery_crawl.tools.exporter",
    "celery_crawl.http_server": "celery_crawl.tools.http_server",
    "celery_crawl.embedded": "celery_crawl.tools.embedded",
    # moved within the packages, so that no two packages import each other
    "celery_crawl.queue.entries": "celery_crawl.core.entries",
    "celery_crawl.hosting.logcontext": "celery_crawl.jobs.logcontext",
}


def lazy(
    package: str, homes: dict[str, str], fallbacks: Sequence[str] = ()
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: name -> ``getattr(import(homes[name]), name)``.

    A name not in ``homes`` is looked up in the ``fallbacks`` modules, in order: the homes
    of what the old module of the package's name held (``celery_crawl.hosting.CrawlerHost``).
    """

    def getattr_(name: str) -> Any:
        if name in homes:
            return getattr(importlib.import_module(homes[name]), name)
        if not name.startswith("__") and not _is_submodule(package, name):
            for fallback in fallbacks:
                module = importlib.import_module(fallback)
                if hasattr(module, name):
                    return getattr(module, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return getattr_


def _is_submodule(package: str, name: str) -> bool:
    """``from package import name`` of a module: the import system imports it, not us."""
    return importlib.util.find_spec(f"{package}.{name}") is not None


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path of :data:`MOVED` as its new module, with a warning."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {MOVED[spec.name]}: import it from there",
            DeprecationWarning,
            stacklevel=4,
        )
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was imported under its new name."""

    def get_code(self, fullname: str) -> Any:
        """``python -m <old path>``: runs the new module as ``__main__``, with the warning."""
        new = MOVED[fullname]
        source = (
            "import runpy, sys\n"
            f"print('{fullname} moved to {new}: run python -m {new}', file=sys.stderr)\n"
            f"runpy.run_module({new!r}, run_name='__main__', alter_sys=True)\n"
        )
        return compile(source, f"<{fullname}, moved to {new}>", "exec")


def install() -> None:
    """Let the old module paths of :data:`MOVED` import (once per process)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
