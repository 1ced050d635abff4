"""Values read back from Redis that are not what their key holds: named, skipped and counted.

The exporter and ``celery-crawl status`` read keys that any Redis writer may
have filled with any bytes: a count that is text, a field or a member that is
not UTF-8, a key of the wrong type. Each reader hands what it meets to a
:class:`BadValues`, which logs each key once (per process), counts how often
it was met, and lets the reader skip the value and serve everything else.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from celery_crawl.core.errors import cut, quote

logger = logging.getLogger(__name__)

MAX_KEYS = 100  # keys named one by one; beyond, they are counted under OTHER_KEYS
OTHER_KEYS = "(other keys)"


def _text(key: str | bytes) -> str:
    """A key as text, whatever its bytes: a site's key holds the site name Redis was given."""
    if isinstance(key, bytes):
        return key.decode("utf-8", "backslashreplace")
    return key


class BadValues:
    """The bad values met so far: key -> times met, and the last reason."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.reasons: dict[str, str] = {}

    def note(self, key: str | bytes, reason: str) -> None:
        name = _text(key)
        if name not in self.counts and len(self.counts) >= MAX_KEYS:
            name = OTHER_KEYS
        if name not in self.counts:
            logger.warning("skipped a bad value in Redis key %s: %s", name, reason)
        self.counts[name] += 1
        self.reasons[name] = cut(reason)

    def as_list(self) -> list[dict[str, Any]]:
        return [
            {"key": key, "reason": self.reasons[key], "count": count}
            for key, count in sorted(self.counts.items())
        ]

    def text(self, key: str, value: bytes | str, what: str) -> str | None:
        """``value`` as UTF-8 text; None, noted, when it is not."""
        if isinstance(value, str):
            return value
        try:
            return value.decode()
        except UnicodeDecodeError:
            self.note(key, f"{what} {quote(value)} is not UTF-8")
            return None

    def count(self, key: str, value: Any, what: str) -> int | None:
        """``value`` as a whole number; None, noted, when it is not one."""
        try:
            return int(value)
        except (TypeError, ValueError):
            self.note(key, f"{what} {quote(value)} is not a whole number")
            return None

    def reply(self, key: str, reply: Any) -> Any:
        """A pipelined reply; None, noted, when the command failed (a key of the wrong type)."""
        if isinstance(reply, Exception):
            self.note(key, f"read failed: {cut(str(reply))}")
            return None
        return reply

    def text_hash(self, key: str, reply: Any) -> dict[str, str]:
        """A hash read with HGETALL, as text; a field or value that is not UTF-8 is left out."""
        found = {}
        for raw_field, raw_value in (self.reply(key, reply) or {}).items():
            field = self.text(key, raw_field, "field")
            value = None if field is None else self.text(key, raw_value, f"field {field!r}:")
            if field is not None and value is not None:
                found[field] = value
        return found

    def count_hash(self, key: str, reply: Any) -> dict[str, int | None]:
        """A hash of counts: a value that is not a number is None (noted), its series skipped;
        a field that is not UTF-8 is left out."""
        return {
            field: self.count(key, value, f"field {field!r}:")
            for field, value in self.text_hash(key, reply).items()
        }
