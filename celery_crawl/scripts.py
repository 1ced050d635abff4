"""The Lua scripts in ``celery_crawl/lua``, loaded once and registered per client.

Each ``.lua`` file starts with a header listing its KEYS and ARGV. A line
``--!include NAME`` pulls in ``NAME.lua``, or the file named by the keyword
argument ``NAME``: the enqueue script takes the configured dupefilter's file
as ``dedup``.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

from redis.commands.core import Script

_INCLUDE = re.compile(r"^--!include (\w+)$", re.MULTILINE)


@functools.cache
def source(name: str, **includes: str) -> str:
    text = resources.files("celery_crawl").joinpath("lua", f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda m: source(includes.get(m.group(1), m.group(1))), text)


_registered: dict[tuple[int, str, tuple[tuple[str, str], ...]], Script] = {}


def script(client: Any, name: str, **includes: str) -> Script:
    """The registered script ``name`` for ``client`` (EVALSHA with a load fallback)."""
    key = (id(client), name, tuple(sorted(includes.items())))
    if key not in _registered:
        _registered[key] = client.register_script(source(name, **includes))
    return _registered[key]
