"""Requests handed to another spider of the same group (the vertical split).

A list spider that should not crawl posts itself yields::

    yield to_spider(Request(url, callback=self.parse_post), "forum_detail")

Its scheduler pushes that request into ``forum_detail``'s queue instead of its
own, with the same job id, so the job spans both spiders. The target must be
in the same group (``CELERY_CRAWL_SPIDER_GROUPS``): the job's counters live
in the group's hash tag. The callback is stored by name and resolved against
the target spider, which must have a method of that name (typically both
spiders share a base class).
"""

from __future__ import annotations

from scrapy import Request

from celery_crawl.core.errors import ConfigError
from celery_crawl.queue.queues import Base
from celery_crawl.scheduler.components import Components

SPIDER_META = "celery_crawl.spider"


def to_spider(request: Request, spider: str | None) -> Request:
    """Mark ``request`` for ``spider``'s queue; ``None`` leaves it with its own spider."""
    if spider:
        request.meta[SPIDER_META] = spider
    return request


def target_of(request: Request, own: str) -> str | None:
    """The other spider that ``request`` is for, or None for the spider's own queue."""
    target = request.meta.get(SPIDER_META)
    return None if not target or target == own else str(target)


class Router:
    """The queues of the other spiders of one spider's group, built on first use
    by the same factory as the spider's own queue."""

    def __init__(self, own: Base, components: Components) -> None:
        self.own = own
        self.components = components
        self._queues: dict[str, Base] = {}

    def queue(self, spider: str) -> Base:
        """``spider``'s queue; :class:`ConfigError` if it is outside the own group."""
        queue = self._queues.get(spider)
        if queue is None:
            keys = self.components.keys(spider)
            if keys.group != self.own.keys.group:
                raise ConfigError(
                    f"cannot route a request from {self.own.keys.spider!r} to {spider!r}: "
                    f"not in its group {self.own.keys.group!r} (CELERY_CRAWL_SPIDER_GROUPS)"
                )
            queue = self.components.queue(keys)
            self._queues[spider] = queue
        return queue
