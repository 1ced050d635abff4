"""Idle spiders beside the forum's, so that a benchmark worker hosts a project of real size.

``BENCH_HOSTED_SPIDERS`` (2 by default: the forum app's two) is how many
spiders each worker hosts; the ones beyond the forum's two are copies of the
forum spider under other names, which no job uses.
"""

from __future__ import annotations

import os

from celery_crawl.demo.spiders import ForumSpider

HOSTED = int(os.environ.get("BENCH_HOSTED_SPIDERS", "2"))
IDLE_NAMES = [f"idle_{n:02d}" for n in range(max(0, HOSTED - 2))]

for _name in IDLE_NAMES:
    globals()[_name] = type(_name, (ForumSpider,), {"name": _name, "__module__": __name__})
