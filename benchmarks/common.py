"""Shared by the benchmarks: a Redis to run against (``REDIS_URL`` or embedded), medians, tables."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from celery_crawl.tools.embedded import redis_url

__all__ = ["median", "redis_url", "table"]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table, so the output can go straight into the README."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
