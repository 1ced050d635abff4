"""Names a package re-exports from its modules, loaded when first used.

A package whose name users type in settings (``celery_crawl.queue.PriorityQueue``)
re-exports its public classes lazily, so that importing one of its modules does not
load the others, and no import cycle can form through the package itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: name -> ``getattr(import(homes[name]), name)``."""

    def getattr_(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return getattr_
