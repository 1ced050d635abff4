"""A file of sources, YAML, TOML or JSON, for ``celery-crawl sources import`` and ``export``.

The file maps each spider to its sources; each source is a :class:`Source`'s fields,
and ``paused: true`` for one that waits::

    forum:
      - id: busy-board
        seeds: ["00001"]
        interval: 300
        adaptive: true
        min_interval: 60
        max_interval: 3600
      - id: quiet-board
        seeds: ["00002"]
        interval: 86400
        paused: true

A source keeps its paused state unless the file gives ``paused``. Importing with ``sync``
makes each spider of the file hold exactly the file's sources, paused as the file says:
the others of those spiders are removed. A file that breaks a rule changes nothing.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from celery_crawl.core.errors import BadInput, quote
from celery_crawl.producer.schedule import Schedule, Source

PAUSED = "paused"  # a field of a source in a file, not of its definition


def parse(text: str, suffix: str) -> dict[str, list[tuple[Source, bool | None]]]:
    """The file's sources by spider, each with its ``paused`` (None: not given);
    raises :class:`BadInput`."""
    try:
        if suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise BadInput(f"sources file: not {suffix.lstrip('.') or 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise BadInput("sources file: a mapping of spider name to a list of its sources")
    found: dict[str, list[tuple[Source, bool | None]]] = {}
    for spider, sources in data.items():
        if not isinstance(sources, list):
            raise BadInput(f"sources file: spider {quote(spider)}: a list of sources")
        found[spider] = [_source(spider, entry) for entry in sources]
        ids = [source.id for source, _ in found[spider]]
        if len(set(ids)) != len(ids):
            raise BadInput(f"sources file: spider {quote(spider)} has a source id twice")
    return found


def _source(spider: str, entry: Any) -> tuple[Source, bool | None]:
    if not isinstance(entry, dict):
        raise BadInput(f"sources file: spider {quote(spider)}: a source is a mapping")
    fields = dict(entry)
    paused = fields.pop(PAUSED, None)
    if paused is not None and not isinstance(paused, bool):
        raise BadInput(f"sources file: {quote(fields.get('id'))}: paused is true or false")
    try:
        return Source.from_mapping(fields), paused
    except BadInput as exc:
        raise BadInput(f"sources file: spider {quote(spider)}: {exc}") from None


def read(path: Path) -> dict[str, list[tuple[Source, bool | None]]]:
    return parse(path.read_text(encoding="utf-8"), path.suffix.lower())


def load(
    schedule: Schedule, sources: list[tuple[Source, bool | None]], *, sync: bool
) -> dict[str, int]:
    """Put ``sources`` into ``schedule``. A source's ``paused`` is kept unless the file gives
    it; with ``sync`` the file is the truth: no ``paused`` is not paused, and the schedule's
    sources the file lacks are removed."""
    counts = {"added": 0, "changed": 0, "unchanged": 0, "removed": 0}
    for source, paused in sources:
        counts[schedule.put(source, paused=bool(paused) if sync else paused)] += 1
    if sync:
        kept = {source.id for source, _ in sources}
        for source in schedule.sources():
            if source.id not in kept and schedule.remove(source.id):
                counts["removed"] += 1
    return counts


def dump(schedules: dict[str, Schedule]) -> str:
    """Every source of ``schedules``, by spider, as YAML that :func:`read` takes back."""
    data: dict[str, list[dict[str, Any]]] = {}
    for spider, schedule in schedules.items():
        entries = []
        for source in schedule.sources():
            state = schedule.get(source.id)
            entry = {k: v for k, v in asdict(source).items() if v not in (None, {}, False)}
            if state is not None and state.paused:
                entry[PAUSED] = True
            entries.append(entry)
        if entries:
            data[spider] = entries
    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
