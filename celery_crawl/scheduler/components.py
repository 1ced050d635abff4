"""The one factory of queues and dedup filters: :class:`Components`.

The scheduler, the project (jobs started outside a crawl, the command line),
routing (requests for another spider of the group) and the producer all build
their queues, dedup filters and groups here, from one spider's settings (its
``custom_settings`` included). So a job's seeds go into the same kind of queue,
with the same dedup, that the spider's scheduler reads, and every queue of a
group is configured, repaired and capped the same way.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from scrapy.utils.misc import load_object

from celery_crawl.core import compat, connection
from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys, group_members
from celery_crawl.dupefilter.filters import DUPEFILTER_CLASSES, DedupScript, RFPDupeFilter
from celery_crawl.politeness.sites import SitePolicy
from celery_crawl.producer.producer import Producer
from celery_crawl.producer.schedule import Schedule
from celery_crawl.queue.leases import LeaseTimes
from celery_crawl.queue.queues import QUEUE_CLASSES, Base

if TYPE_CHECKING:
    import redis
    from scrapy.crawler import Crawler

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


class Components:
    """Queues, dedup filters, groups and producers, as one spider's ``settings`` configure them.

    ``client`` defaults to the settings' Redis (``REDIS_URL``, ``REDIS_PARAMS``).
    """

    def __init__(self, settings: Any, client: redis.Redis | None = None) -> None:
        self.settings = settings
        self.client = client if client is not None else connection.from_settings(settings)
        self.dupefilter_class = dupefilter_class(settings)
        self.queue_class = queue_class(settings)

    @classmethod
    def from_crawler(cls, crawler: Crawler, client: redis.Redis | None = None) -> Components:
        return cls(crawler.settings, client)

    @cached_property
    def dedup(self) -> DedupScript:
        """The dedup filter's script, with its parameters, that every queue runs."""
        return self.dupefilter_class.script_from_settings(self.settings)

    def keys(self, spider: str) -> SpiderKeys:
        return SpiderKeys.from_settings(spider, self.settings)

    def group(self, spider: str) -> list[SpiderKeys]:
        """The keys of every spider of ``spider``'s group (its requests may be routed there)."""
        return [self.keys(name) for name in group_members(spider, self.settings)]

    def queue(self, spider: str | SpiderKeys, dedup: DedupScript | None = None) -> Base:
        """``spider``'s queue: ``SCHEDULER_QUEUE_CLASS``, with every queue setting and the dedup
        (``dedup``: the script of the filter a scheduler checks with, as that filter built it)."""
        keys = spider if isinstance(spider, SpiderKeys) else self.keys(spider)
        settings = self.settings
        return self.queue_class(
            self.client,
            keys,
            dedup=dedup or self.dedup,
            ack_replicas=setting(settings, "CELERY_CRAWL_ACK_REPLICAS"),
            ack_timeout=setting(settings, "CELERY_CRAWL_ACK_TIMEOUT"),
            deadletter_max=setting(settings, "SCHEDULER_DEADLETTER_MAX"),
            dedup_scope=setting(settings, "DUPEFILTER_SCOPE"),
            sites=SitePolicy.from_settings(settings),
            leases=LeaseTimes.from_settings(settings),
        )

    def dupefilter(self, spider: str, crawler: Crawler | None = None) -> RFPDupeFilter:
        """``spider``'s shared filter (``DUPEFILTER_CLASS``); with ``crawler``, the one its
        scheduler checks requests with (its fingerprinter, stats and ``DUPEFILTER_DEBUG``)."""
        if crawler is not None:
            return self.dupefilter_class.from_crawler(crawler)
        params = self.dupefilter_class.params_class.from_settings(self.settings)
        return self.dupefilter_class(self.client, self.keys(spider), None, params=params)

    def producer(self, spider: str) -> Producer:
        """``spider``'s producer, capped over the queues of its whole group."""
        return Producer(
            self.client,
            self.keys(spider),
            job_cap=setting(self.settings, "PRODUCER_JOB_CAP"),
            queue_cap=setting(self.settings, "PRODUCER_QUEUE_CAP"),
            group=self.group(spider),
        )

    def schedule(self, spider: str) -> Schedule:
        """``spider``'s sources on their own schedules, capped as its producer is."""
        return Schedule(self.client, self.keys(spider), self.group(spider))
