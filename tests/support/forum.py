"""The demo forum the worker tests crawl: its size, its seeds, and what a complete crawl yields."""

from __future__ import annotations

from typing import Any

from celery_crawl.demo.site import SiteConfig

FORUM = SiteConfig(forums=3, posts_per_forum=60, hot_every=20, hot_comment_pages=6)


def forum_seeds() -> list[dict[str, str]]:
    return [{"forum_id": forum} for forum in FORUM.forum_ids()]


def assert_complete_forum_crawl(result: dict[str, Any], context: str = "") -> None:
    """Every page and item of the forum counted once; a failure shows the job's counts
    (and ``context``: what the test saw besides)."""
    expected = FORUM.expected()
    fields = ("state", "pages", "items", "status_codes", "queued", "in_flight", "errors")
    counts = {field: result.get(field) for field in fields}
    seen = f"{counts} {context}"
    assert result["state"] == "done", seen
    assert result["pages"] == expected.pages + expected.not_found, seen
    assert result["items"] == expected.posts + expected.comments, seen
    assert result["status_codes"] == {"200": expected.pages, "404": expected.not_found}, seen
    assert result["queued"] == result["in_flight"] == 0, seen
    assert result["errors"] == {}, seen
