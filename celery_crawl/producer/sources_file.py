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

With ``PRODUCER_SOURCES_FILE``, each producer tick syncs the file into its spider's
schedule when the file has changed since the last sync (:func:`sync_file`), so that
editing the file is the deploy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis
import yaml

from celery_crawl.core.errors import BadInput, CeleryCrawlError, quote
from celery_crawl.producer.schedule import Schedule, Source

logger = logging.getLogger(__name__)
PAUSED = "paused"  # a field of a source in a file, not of its definition
BAD = "bad:"  # before the digest of a file version that could not be read: not tried again


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
        kind = {".toml": "TOML", ".json": "JSON"}.get(suffix, "YAML")
        raise BadInput(f"sources file: not {kind}: {exc}") from None
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
    schedule: Schedule,
    sources: list[tuple[Source, bool | None]],
    *,
    sync: bool,
    splay: bool = False,
) -> dict[str, int]:
    """Put ``sources`` into ``schedule``. A source's ``paused`` is kept unless the file gives
    it; with ``sync`` the file is the truth: no ``paused`` is not paused, and the schedule's
    sources the file lacks are removed. ``splay`` spreads new sources' first jobs over their
    first interval (:meth:`Schedule.put`)."""
    counts = {"added": 0, "changed": 0, "unchanged": 0, "removed": 0}
    for source, paused in sources:
        given = bool(paused) if sync else paused
        counts[schedule.put(source, paused=given, splay=splay)] += 1
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
        for state in schedule.states():  # one round trip for the spider's sources
            entry = {k: v for k, v in asdict(state.source).items() if v not in (None, {}, False)}
            if state.paused:
                entry[PAUSED] = True
            entries.append(entry)
        if entries:
            data[spider] = entries
    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def sync_file(schedule: Schedule, path: str) -> dict[str, int] | None:
    """Sync the sources file at ``path`` into ``schedule`` (its spider's part, as
    ``import --sync``) if the file changed since; the counts, or None if not synced.

    The digest of the version last synced is kept in Redis, so that a tick costs a file
    read. A version that cannot be read is logged once, counted
    (``producer/sources_file_errors``) and changes nothing (a source it refuses may
    follow others already synced). A missing file is logged at every tick; a sync that
    Redis refuses is logged at every tick, and counted when Redis takes the count (a
    full Redis refuses that too); either way the rest of the tick goes on. Two ticks
    that sync different versions at once leave the digest of one: a tick whose digest
    differs from the file's syncs it again.

    A spider the file does not name keeps its sources: ``forum: []`` removes all of
    them. New sources are due at once: to spread a large first import,
    ``celery-crawl sources import FILE --splay`` it before pointing the setting at it.
    """
    spider, keys = schedule.keys.spider, schedule.keys
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        logger.error("PRODUCER_SOURCES_FILE %s not read: %s; the schedule is unchanged", path, exc)
        return None
    digest = hashlib.sha256(raw).hexdigest()
    try:
        if _last_synced(schedule) in (digest, BAD + digest):
            return None
        found = parse(raw.decode("utf-8"), Path(path).suffix.lower())
        counts = load(schedule, found[spider], sync=True) if spider in found else None
        schedule.client.set(keys.schedule_file, digest)
    except (BadInput, UnicodeDecodeError) as exc:  # this version: logged once
        logger.error("PRODUCER_SOURCES_FILE %s: %s; the schedule is unchanged", path, exc)
        _count_error(schedule, BAD + digest)
        return None
    except (CeleryCrawlError, redis.RedisError) as exc:  # Redis refused: the next tick retries
        logger.error("PRODUCER_SOURCES_FILE %s not synced: %s; tried again next tick", path, exc)
        _count_error(schedule, None)
        return None
    if counts is not None:
        summary = ", ".join(f"{n} {what}" for what, n in counts.items())
        logger.info("PRODUCER_SOURCES_FILE %s synced into %s: %s", path, spider, summary)
    return counts


def _count_error(schedule: Schedule, mark: str | None) -> None:
    """Count a failed sync and, with ``mark``, remember its version; as Redis allows."""
    with schedule.client.pipeline(transaction=True) as pipe:
        if mark is not None:
            pipe.set(schedule.keys.schedule_file, mark)
        pipe.hincrby(schedule.keys.stats, "producer/sources_file_errors", 1)
        with contextlib.suppress(redis.RedisError):  # refused, or a damaged count:
            pipe.execute(raise_on_error=False)  # the error is logged still


def _last_synced(schedule: Schedule) -> str | None:
    try:
        value = schedule.client.get(schedule.keys.schedule_file)
    except redis.ResponseError:  # of another type: the next SET replaces it
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else None
