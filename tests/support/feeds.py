"""The JSON-lines feeds that test crawls write their items to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_items(feed: Path) -> list[dict[str, Any]]:
    """The items of a JSON-lines feed, in order; none if the crawl wrote no feed."""
    if not feed.exists():
        return []
    return [json.loads(line) for line in feed.read_text().splitlines() if line]
