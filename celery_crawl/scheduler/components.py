"""Which queue and dupefilter classes the settings name.

The scheduler, and the code that starts jobs outside a crawl, resolve them
here, so a job's seeds go into the same kind of queue, with the same dedup,
that the spider's scheduler reads.
"""

from __future__ import annotations

from typing import Any

from scrapy.utils.misc import load_object

from celery_crawl.core import compat
from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.dupefilter.filters import DUPEFILTER_CLASSES, RFPDupeFilter
from celery_crawl.queue.queues import QUEUE_CLASSES, Base

SCRAPY_DEFAULT_DUPEFILTER = "scrapy.dupefilters.RFPDupeFilter"
DEFAULT_DUPEFILTER: str = SETTINGS["DUPEFILTER_CLASS"].default


def load_class(path: str | type, known: dict[str, Any], setting: str) -> Any:
    """A class from a setting: a known name, a class, or an importable path."""
    if not isinstance(path, str):
        return path
    if path in known:
        return known[path]
    if compat.is_scrapy_redis(path):  # never import scrapy-redis's own classes
        raise compat.refusal(setting, path)
    try:
        return load_object(path)
    except (ImportError, NameError, ValueError) as exc:
        raise ConfigError(f"{setting} = {path!r} cannot be imported: {exc}") from exc


def dupefilter_class(settings: Any) -> type[RFPDupeFilter]:
    """``DUPEFILTER_CLASS``; Scrapy's in-memory default means ours."""
    path = setting(settings, "DUPEFILTER_CLASS")
    if path == SCRAPY_DEFAULT_DUPEFILTER:
        path = DEFAULT_DUPEFILTER
    return load_class(path, DUPEFILTER_CLASSES, "DUPEFILTER_CLASS")  # type: ignore[no-any-return]


def queue_class(settings: Any) -> type[Base]:
    path = setting(settings, "SCHEDULER_QUEUE_CLASS")
    return load_class(path, QUEUE_CLASSES, "SCHEDULER_QUEUE_CLASS")  # type: ignore[no-any-return]
