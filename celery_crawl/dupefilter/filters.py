"""Shared request dedup: exact (the default), bloom filter, expiring, or hit-expiring.

Fingerprints come from the crawler's ``request_fingerprinter`` (so
``REQUEST_FINGERPRINTER_CLASS`` is respected). Each filter class has a Lua
fragment that fills the enqueue scripts' ``dupefilter`` slot, so check and
enqueue are one atomic step; ``request_seen`` runs the same check alone, for
use outside a scheduler. The layouts are described in the Lua fragments:

- ``RFPDupeFilter`` (``dupefilter/lua/include/dedup_exact.lua``): binary digests in bucketed sets;
  never wrong, about 23 bytes a fingerprint.
- ``BloomDupeFilter`` (``dupefilter/lua/include/dedup_bloom.lua``): a scalable bloom filter on
  plain bitmaps, under 2 bytes a fingerprint; a false positive drops a
  request that was never crawled, at a rate below ``error_rate``.
- ``ExpiringDupeFilter`` (``dupefilter/lua/include/dedup_expiring.lua``): exact, but forgets a
  fingerprint after a window, so memory is bounded by the window.
- ``HitExpiringDupeFilter`` (``dupefilter/lua/include/dedup_hits.lua``): exact, but forgets
  a fingerprint that ``DUPEFILTER_EXPIRE_CRAWLS`` crawls of its source in a row did not
  meet, so memory is bounded by what the source still links.

:data:`KINDS` is the registry of the kinds: each one's name, class, fragment and how
its size is read; every other place that knows the kinds derives from it (its keys
are named in :data:`celery_crawl.dupefilter.keys.DEDUP_KEYS`, for the repair of damaged
keys).

A filter's parameters (its kind's params class, such as :class:`BloomParams`) travel
as the tail of every script's ARGV and are stored in Redis when the filter is
created; the stored ones win, and ``open`` warns when the settings differ.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self

import redis
from scrapy import Request, Spider

from celery_crawl.core import connection, scripts
from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.core.repair import Repairer, retried
from celery_crawl.dupefilter.keys import DEDUP_KEYS

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

MAX_BLOOM_BITS = 2**32 - 8  # a Redis string holds at most 512 MB
_WARNED: dict[str, bool] = {}  # the spiders warned of a hit-expiring filter outside its scope


@dataclasses.dataclass(frozen=True)
class DedupScript:
    """What fills the enqueue scripts' ``dupefilter`` slot, and the ARGV tail they pass it."""

    lua: str = "dedup_exact"
    params: tuple[str, ...] = ()


EXACT_DEDUP = DedupScript()


@dataclasses.dataclass(frozen=True)
class Params:
    """A filter's parameters; the field names are those stored in Redis."""

    @classmethod
    def from_settings(cls, settings: Any) -> Self:
        return cls()

    def args(self) -> tuple[str, ...]:
        """The parameters in the order the Lua file reads them."""
        return tuple(str(getattr(self, f.name)) for f in dataclasses.fields(self))

    def differences(self, stored: dict[str, str]) -> list[str]:
        """``name: stored (settings: value)`` for each parameter the stored filter has otherwise."""
        return [
            f"{f.name}={stored[f.name]} (settings: {getattr(self, f.name)})"
            for f in dataclasses.fields(self)
            if f.name in stored
            and not math.isclose(float(stored[f.name]), float(getattr(self, f.name)))
        ]


@dataclasses.dataclass(frozen=True)
class BloomParams(Params):
    """A scalable bloom filter: ``capacity`` fingerprints in the first sub-filter.

    ``error_rate`` bounds the false-positive rate however far the filter grows:
    sub-filter i is sized for ``error_rate * (1 - tightening) * tightening**i``
    and holds ``capacity * growth**i`` fingerprints, in at most ``max_bits`` bits.
    """

    capacity: int = SETTINGS["DUPEFILTER_BLOOM_CAPACITY"].default
    error_rate: float = SETTINGS["DUPEFILTER_BLOOM_ERROR_RATE"].default
    growth: int = 2
    tightening: float = 0.3
    max_bits: int = 2**30

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.growth < 1:
            raise ConfigError("DUPEFILTER_BLOOM_CAPACITY and the growth must be at least 1")
        if not (0 < self.error_rate < 1 and 0 < self.tightening < 1):
            raise ConfigError("DUPEFILTER_BLOOM_ERROR_RATE must lie between 0 and 1")
        if not 64 <= self.max_bits <= MAX_BLOOM_BITS:
            raise ConfigError(f"a bloom sub-filter needs between 64 and {MAX_BLOOM_BITS} bits")

    @classmethod
    def from_settings(cls, settings: Any) -> Self:
        return cls(
            capacity=setting(settings, "DUPEFILTER_BLOOM_CAPACITY"),
            error_rate=setting(settings, "DUPEFILTER_BLOOM_ERROR_RATE"),
        )


@dataclasses.dataclass(frozen=True)
class ExpiringParams(Params):
    """Fingerprints are forgotten ``window_ms`` (plus at most one bucket) after their add."""

    window_ms: int = round(SETTINGS["DUPEFILTER_EXPIRE_SECONDS"].default * 1000)
    buckets: int = SETTINGS["DUPEFILTER_EXPIRE_BUCKETS"].default

    def __post_init__(self) -> None:
        if self.buckets < 1 or self.window_ms < self.buckets:
            raise ConfigError(
                "DUPEFILTER_EXPIRE_BUCKETS must be at least 1 and the window at least 1 ms a bucket"
            )

    @classmethod
    def from_settings(cls, settings: Any) -> Self:
        seconds = setting(settings, "DUPEFILTER_EXPIRE_SECONDS")
        return cls(
            window_ms=round(seconds * 1000),
            buckets=setting(settings, "DUPEFILTER_EXPIRE_BUCKETS"),
        )


@dataclasses.dataclass(frozen=True)
class HitsParams(Params):
    """A fingerprint is forgotten once ``crawls`` crawls of its source in a row missed it."""

    crawls: int = SETTINGS["DUPEFILTER_EXPIRE_CRAWLS"].default

    def __post_init__(self) -> None:
        if self.crawls < 1:
            raise ConfigError(f"DUPEFILTER_EXPIRE_CRAWLS must be at least 1, not {self.crawls}")

    @classmethod
    def from_settings(cls, settings: Any) -> Self:
        return cls(crawls=setting(settings, "DUPEFILTER_EXPIRE_CRAWLS"))


class RFPDupeFilter:
    """Exact dedup shared by every process that points at the same Redis."""

    lua: ClassVar[str] = "dedup_exact"
    params_class: ClassVar[type[Params]] = Params

    def __init__(
        self,
        client: redis.Redis,
        keys: SpiderKeys,
        fingerprinter: Any,
        *,
        debug: bool = False,
        stats: Any = None,
        params: Params | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.fingerprinter = fingerprinter
        self.debug = debug
        self.stats = stats
        self.params = params if params is not None else self.params_class()
        if not isinstance(self.params, self.params_class):
            raise ConfigError(f"{type(self).__name__} takes {self.params_class.__name__}")
        self.script = DedupScript(self.lua, self.params.args())
        self.repairer = Repairer(client, keys)
        self._logged_first = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(
            connection.from_settings(crawler.settings),
            SpiderKeys.from_settings(crawler.spidercls.name, crawler.settings),
            crawler.request_fingerprinter,
            debug=crawler.settings.getbool("DUPEFILTER_DEBUG"),
            stats=crawler.stats,
            params=cls.params_class.from_settings(crawler.settings),
        )

    @classmethod
    def script_from_settings(cls, settings: Any) -> DedupScript:
        """The script of this filter as ``settings`` configure it (jobs started outside a crawl)."""
        return DedupScript(cls.lua, cls.params_class.from_settings(settings).args())

    def fingerprint(self, request: Request) -> bytes:
        return bytes(self.fingerprinter.fingerprint(request))

    def request_seen(self, request: Request) -> bool:
        return not self.add_fingerprints([self.fingerprint(request)])[0]

    def add_fingerprints(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Record fingerprints atomically; a flag per fingerprint, True = it was new."""
        return [bool(flag) for flag in self._run("add", fingerprints)]

    def seen_fingerprints(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Check without recording; a flag per fingerprint, True = seen (or a false positive)."""
        return [bool(flag) for flag in self._run("seen", fingerprints)]

    def __len__(self) -> int:
        """The number of fingerprints: exact, or for a bloom filter those it took as new."""
        return int(self._run("count"))

    def memory_usage(self) -> int:
        """Bytes used by the filter's keys, as Redis reports them."""
        return int(self._run("memory"))

    def clear(self) -> None:
        self._run("clear")

    def stored_params(self) -> dict[str, str]:
        """The parameters stored with the filter (created from ours when missing)."""
        flat = [v.decode() if isinstance(v, bytes) else str(v) for v in self._run("config")]
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def _run(self, command: str, fingerprints: Sequence[bytes] = ()) -> Any:
        """One call of ``dupefilter/lua/dedup.lua``; refused for a damaged key of the filter
        (nothing written), the key is moved aside and the call sent once more."""
        keys = [self.keys.dupefilter, self.keys.dupefilter_count]
        args: list[Any] = [command, len(fingerprints), *fingerprints, *self.script.params]
        dedup = scripts.script(self.client, "dedup", dupefilter=self.lua)
        return retried(self.repairer, lambda: dedup(keys=keys, args=args))

    @property
    def kind(self) -> str:
        """The kind the filter records in Redis: its name in :data:`KINDS`."""
        return self.lua.removeprefix("dedup_")

    def open(self) -> None:
        """Scrapy's dupefilter hook: refuse another kind of filter's keys; warn on parameters.

        The first process to open a spider's filter records its kind. A filter
        of another kind would start empty beside the old keys and fetch again
        what they remember, so it refuses to open until the old one is cleared.
        """
        claimed = self._run("claim")
        if claimed is not None and claimed.decode() != self.kind:
            raise ConfigError(
                f"the dedup filter at {self.keys.dupefilter} is of kind {claimed.decode()!r},"
                f" but DUPEFILTER_CLASS is {type(self).__name__} ({self.kind!r}): set it back,"
                " or clear the old filter first (SCHEDULER_FLUSH_ON_START for one run)"
            )
        if not self.script.params:
            return
        differences = self.params.differences(self.stored_params())
        if differences:
            logger.warning(
                "the dedup filter at %s keeps the parameters it was created with: %s."
                " Clear it (SCHEDULER_FLUSH_ON_START) to apply the settings.",
                self.keys.dupefilter,
                ", ".join(differences),
            )

    def close(self, reason: str = "") -> None:
        """Scrapy's dupefilter hook; the filter persists or is cleared by the scheduler."""

    def log(self, request: Request, spider: Spider) -> None:
        if self.debug:
            logger.debug("Filtered duplicate request: %(request)s", {"request": request})
        elif not self._logged_first:
            logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
            )
            self._logged_first = True
        if self.stats is not None:
            self.stats.inc_value("dupefilter/filtered")


class BloomDupeFilter(RFPDupeFilter):
    """A scalable bloom filter: under 2 bytes a fingerprint, a false positive now and then.

    A false positive drops a request that was never crawled, at a rate below
    ``DUPEFILTER_BLOOM_ERROR_RATE``; use it when memory matters more.
    """

    lua = "dedup_bloom"
    params_class = BloomParams


class ExpiringDupeFilter(RFPDupeFilter):
    """Exact dedup that forgets a fingerprint ``DUPEFILTER_EXPIRE_SECONDS`` after its add."""

    lua = "dedup_expiring"
    params_class = ExpiringParams


class HitExpiringDupeFilter(RFPDupeFilter):
    """Exact dedup that forgets a fingerprint ``DUPEFILTER_EXPIRE_CRAWLS`` crawls of its
    source after the last one that met it (linked to it again).

    For recrawls with ``DUPEFILTER_SCOPE = "spider"``: a crawl is a job, its source the
    job's ``source`` (the producer's schedule sets it; ``crawl(..., source=...)``).
    A page that every crawl links (a forum's listing of its newest posts) stays known
    however long it is linked; once it scrolls off, it is forgotten N crawls later,
    however long those take. Each source's fingerprints are its own.
    """

    lua = "dedup_hits"
    params_class = HitsParams

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        scope = setting(crawler.settings, "DUPEFILTER_SCOPE")
        if scope != "spider" and not _WARNED.get(crawler.spidercls.name):
            _WARNED[crawler.spidercls.name] = True  # once per spider and process
            logger.warning(
                "HitExpiringDupeFilter counts the crawls of a source only with"
                " DUPEFILTER_SCOPE = 'spider' (it is %r): the requests that meet it are then"
                " never forgotten",
                scope,
            )
        return super().from_crawler(crawler)


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of dedup filter, and where each of its parts is.

    ``name`` is what the filter records at ``D:kind`` (its fragment's ``DEDUP_KIND``);
    ``filter`` its class, whose ``lua`` names the fragment that fills the enqueue
    scripts' ``dupefilter`` slot and whose ``params_class`` the parameters that travel
    as their ARGV tail and fill ``DUPEFILTER_*`` settings. Its size is ``"count"``, the
    counter at ``D:count``, or ``"own"``, counted by its fragment's ``dedup_count()``
    (``dupefilter/lua/include/dedup_size.lua`` includes such a fragment for the
    exporter); its memory is ``MEMORY USAGE`` over the keys its ``dedup_each_key``
    visits. Its keys and their types are named in
    :data:`celery_crawl.dupefilter.keys.DEDUP_KEYS`, which the repair of damaged keys is
    handed.
    """

    name: str
    filter: type[RFPDupeFilter]
    size: str = "count"

    @property
    def fragment(self) -> str:
        return self.filter.lua

    @property
    def path(self) -> str:
        """The ``DUPEFILTER_CLASS`` path users type: the package re-exports the class."""
        return f"celery_crawl.dupefilter.{self.filter.__name__}"

    @property
    def keys(self) -> dict[str, str | None]:
        """The keys a filter of this kind writes under ``D``, with their types."""
        return {**DEDUP_KEYS[""], **DEDUP_KEYS[self.name]}


# The registry of dedup kinds: everything else derives from it (the settings paths, the
# fragments the scripts are built with, the contract tests over every kind).
KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind("exact", RFPDupeFilter),
        Kind("bloom", BloomDupeFilter),
        Kind("expiring", ExpiringDupeFilter, size="own"),
        Kind("hits", HitExpiringDupeFilter),
    )
}

DUPEFILTER_CLASSES: dict[str, type[RFPDupeFilter]] = {
    **{kind.path: kind.filter for kind in KINDS.values()},
    "scrapy_redis.dupefilter.RFPDupeFilter": RFPDupeFilter,
}
