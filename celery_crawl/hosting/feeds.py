"""Feeds per job: ``FEEDS`` URIs with ``%(job)s`` get a file per job, stored when it ends.

Scrapy's ``FeedExporter`` opens its files when a crawler opens and stores
them when it closes: for a hosted crawler, when the worker stops, with every
job's items in one file. :class:`JobFeedExporter` takes its place in hosted
crawlers (``celery_crawl.hosting.project.HOSTED_MIDDLEWARES``):

- a feed whose URI has ``%(job)s`` gets one slot per job, opened at the job's
  first item in this process and stored on ``job_finished``
  (:mod:`celery_crawl.scheduler.participation`), before ``Job.wait()`` returns;
- every feed may use ``%(worker)s`` (``<host>-<pid>``): a job crawled by several
  processes has one part per process, so its URI needs ``%(worker)s`` too,
  unless one process writes all of it;
- other feeds behave as in Scrapy.

Items are durable before their page is acked: the scheduler sends
``acks_due`` before each write of acks, and :meth:`JobFeedExporter.settle`
flushes every open feed file then, so a killed process's file holds the
items of every page it acked. A job's feed on a remote storage (S3, GCS, FTP:
any ``BlockingFeedStorage``) is written to a spool file of its own instead
of an anonymous temporary file (:class:`Spool`), locked by its process; the
next process on the host that finishes the job, or starts, stores the spool
file of a process that died, to the URI it names.

Everything else is Scrapy's: formats, storages, filters, batches,
``uri_params``. It builds on ``FeedExporter``'s private slot methods
(:data:`PRIVATE`, checked against Scrapy 2.19, like :mod:`celery_crawl.scheduler.engine`);
if an upgrade removes one, the crawler refuses to open, naming it.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import re
import socket
import stat
import tempfile
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self
from urllib.parse import urlparse

from scrapy import signals
from scrapy.extensions.feedexport import (
    BlockingFeedStorage,
    FeedExporter,
    FeedSlot,
    apply_uri_params,
)
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future

from celery_crawl.core.errors import ConfigError
from celery_crawl.jobs.signals import acks_due, job_finished, job_of

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

logger = logging.getLogger(__name__)

JOB_PLACEHOLDER = "%(job)s"
CHECKED_SCRAPY = "2.19"
# FeedExporter's private methods this module builds on
PRIVATE = (
    "_start_new_batch",
    "_get_uri_params",
    "_close_slot",
    "_schedule_slot_close",
    "_get_storage",
)
SPOOL_FOLDER = "celery_crawl-feeds"  # in FEED_TEMPDIR, or the system's temporary folder
RECORD = ("uri", "template", "job")  # a spool file's record: where it goes
# a %(...)s placeholder of a feed URI, as Scrapy's apply_uri_params finds them
PLACEHOLDER = re.compile(r"%\([^)]+\)[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?[diouxXeEfFgGcrsa]")


def check_feed_exporter() -> None:
    """Refuse to start, naming what is missing, if a Scrapy upgrade removed what this builds on.

    Otherwise the first item of a job would fail in the reactor, and every one after it.
    """
    missing = [name for name in PRIVATE if not callable(getattr(FeedExporter, name, None))]
    if missing:
        raise ConfigError(
            f"this Scrapy's FeedExporter has no {', '.join(missing)}: celery_crawl's feeds per"
            f" job were checked against Scrapy {CHECKED_SCRAPY}; remove %(job)s feeds from FEEDS"
            " or use a Scrapy version that has them"
        )


def is_remote(uri: str) -> bool:
    """Whether Scrapy stores this feed when it closes, from a temporary file (S3, GCS, FTP...)."""
    scheme = urlparse(uri).scheme
    return len(scheme) > 1 and scheme not in ("file", "stdout")


def worker_name() -> str:
    """``%(worker)s``: this process, as ``<host>-<pid>``."""
    return f"{socket.gethostname()}-{os.getpid()}"


class SpooledStorage:
    """A remote storage of a job's feed whose file is a :class:`Spool` file, removed once stored.

    Made through :func:`spooled`, whose subclass bears the storage's class name: Scrapy
    counts ``feedexport/success_count/<type(storage).__name__>``.
    """

    def __init__(self, storage: BlockingFeedStorage, data: Path, record: dict[str, str]) -> None:
        self.storage = storage
        self.data = data
        self.record = record
        self.held = -1  # a second descriptor of the locked file: its lock outlives the file

    def open(self, spider: Spider) -> IO[bytes]:
        """The spool file, locked while this process has it open; then its record, whole."""
        file = self.data.open("w+b")
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.held = os.dup(file.fileno())
        written = self.data.with_suffix(".tmp")
        written.write_text(json.dumps(self.record))
        os.replace(written, self.data.with_suffix(".json"))
        return file

    def store(self, file: IO[bytes]) -> Deferred[None]:
        """S3, GCS and FTP close the file in their thread; the lock goes only after the removal."""
        stored = self.storage.store(file)
        stored.addCallback(lambda _: remove_spooled(self.data))
        stored.addBoth(self._release)
        return stored

    def _release(self, result: Any) -> Any:
        if self.held >= 0:
            os.close(self.held)
            self.held = -1
        return result


_spooled_classes: dict[type[BlockingFeedStorage], type[SpooledStorage]] = {}


def spooled(storage: BlockingFeedStorage, data: Path, record: dict[str, str]) -> SpooledStorage:
    """A :class:`SpooledStorage` of ``storage`` whose class has the name of ``storage``'s."""
    kind = type(storage)
    if kind not in _spooled_classes:
        name = kind.__name__
        _spooled_classes[kind] = type(name, (SpooledStorage,), {"__qualname__": name})
    return _spooled_classes[kind](storage, data, record)


class Spool:
    """The spool files of a host's job feeds on remote storages, in one folder.

    ``<id>.part`` holds a feed's bytes, locked (``flock``) by the process that
    writes it; ``<id>.json`` says where it goes: ``{"uri", "template", "job"}``,
    written after the lock is taken. The lock is held until both files are
    removed after the store (S3, GCS and FTP close the file before). A ``.part``
    that another process can lock belongs to a process that died (or one that
    has just removed it): it is stored to its URI by whoever locks it, then both
    files are removed. Only once :meth:`prepare` found the folder to be this
    user's alone, only plain files (no links), and only to a URI that a job feed
    of the crawler on a remote storage renders (``JobFeedExporter._refusal``).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.prepared = False  # its files are read only once it is checked to be this user's
        self.refused = 0  # files found in it that are not spool files of this user's

    @classmethod
    def from_settings(cls, settings: Any) -> Self:
        return cls(Path(settings.get("FEED_TEMPDIR") or tempfile.gettempdir()) / SPOOL_FOLDER)

    def prepare(self) -> None:
        """Create the folder, this user's only: what is in it is uploaded with this process's
        credentials."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = self.folder.lstat()  # a symbolic link is refused, not followed
        mine = stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid()
        if not mine or status.st_mode & 0o077:
            raise ConfigError(
                f"the feed spool folder {self.folder} must belong to this user alone (mode 700,"
                " a folder, not a symbolic link): another user could have feed files uploaded"
                " with this process's credentials; set FEED_TEMPDIR to a folder of this user's"
            )
        self.prepared = True

    def wrap(self, storage: BlockingFeedStorage, **record: str) -> SpooledStorage:
        return spooled(storage, self.folder / f"{uuid.uuid4().hex}.part", record)

    def orphans(self, job: str | None) -> list[tuple[dict[str, str], IO[bytes]]]:
        """The spool files of dead processes (of ``job``, or of every job): locked, open.

        None unless :meth:`prepare` found the folder to be this user's alone.
        """
        found: list[tuple[dict[str, str], IO[bytes]]] = []
        if not self.prepared:
            return found
        for record in sorted(self.folder.glob("*.json")):
            try:
                claimed = claim(record)
            except (OSError, ValueError) as exc:
                logger.warning("feed spool record %s left alone: %s", record, exc)
                self.refused += 1
                continue
            if claimed is not None and job in (None, claimed[0]["job"]):
                found.append(claimed)
            elif claimed is not None:
                claimed[1].close()
        return found


def claim(record: Path) -> tuple[dict[str, str], IO[bytes]] | None:
    """The spool file of ``record`` and where it goes, if no living process holds it.

    Raises ``OSError`` or ``ValueError`` for files that are not spool files of this user's.
    """
    try:
        where = json.loads(read_plain(record))
        file = open_plain(record.with_suffix(".part"))
    except FileNotFoundError:  # stored meanwhile by another process
        return None
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # its process lives, or another one is storing it
        file.close()
        return None
    if not record.exists():
        file.close()  # stored and removed since it was read
        return None
    if not is_record(where):
        file.close()
        raise ValueError(f"not a record of {', '.join(RECORD)}")
    return where, file


def open_plain(path: Path) -> IO[bytes]:
    """``path`` opened to read and write if it is a file of this user's with no other name.

    Not a symbolic link (``O_NOFOLLOW``) nor a hard link to a file elsewhere: what is
    opened here is uploaded.
    """
    file = open(path, "r+b", opener=open_nofollow)  # noqa: SIM115 (returned open)
    status = os.fstat(file.fileno())
    if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1 or status.st_uid != os.getuid():
        file.close()
        raise OSError(f"{path} is not a plain file of this user's")
    return file


def open_nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def read_plain(path: Path) -> str:
    with open_plain(path) as file:
        return file.read().decode()


def is_record(where: Any) -> bool:
    return isinstance(where, dict) and all(isinstance(where.get(f), str) for f in RECORD)


def fits(uri: str, template: str) -> bool:
    """Whether ``template`` renders ``uri`` for some values of its placeholders (none with a /)."""
    literals = PLACEHOLDER.split(template)
    pattern = "[^/]*".join(re.escape(literal) for literal in literals)
    return re.fullmatch(pattern, uri) is not None


def remove_spooled(data: Path) -> None:
    data.unlink(missing_ok=True)
    data.with_suffix(".json").unlink(missing_ok=True)


class JobFeedExporter(FeedExporter):
    """``EXTENSIONS = {"celery_crawl.feeds.JobFeedExporter": 0}`` (hosted crawlers have it)."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        exporter = cls(crawler)
        crawler.signals.connect(exporter.open_spider, signals.spider_opened)
        crawler.signals.connect(exporter.close_spider, signals.spider_closed)
        crawler.signals.connect(exporter.route_item, signals.item_scraped)
        crawler.signals.connect(exporter.store_job_feeds, job_finished)
        crawler.signals.connect(exporter.settle, acks_due)
        return exporter

    def __init__(self, crawler: Crawler) -> None:
        check_feed_exporter()
        super().__init__(crawler)
        self.job_feeds = [uri for uri in self.feeds if JOB_PLACEHOLDER in uri]
        self.job_slots: dict[str, list[FeedSlot]] = {}
        self.worker = worker_name()
        self._job = ""  # the job whose URIs are being filled in
        self.spool = Spool.from_settings(crawler.settings)
        if any(is_remote(uri) for uri in self.job_feeds):
            self.spool.prepare()

    def open_spider(self, spider: Spider) -> None:
        """The feeds without ``%(job)s`` open now, as in Scrapy."""
        for uri, feed_options in self.feeds.items():
            if uri not in self.job_feeds:
                self.slots.append(self._new_slot(uri, feed_options, spider))
        if any(is_remote(uri) for uri in self.job_feeds):  # of processes that died before
            stored = deferred_from_coro(self.store_orphans(spider, None))
            stored.addErrback(lambda f: logger.error("feed spool not read: %s", f.value))

    def route_item(self, item: Any, response: Any, spider: Spider) -> None:
        """An item goes to the feeds of the spider, and to those of its job."""
        self.item_scraped(item, spider)
        job = job_of(response)
        if not (job and self.job_feeds):
            return
        shared, self._job = self.slots, job
        self.slots = self.job_slots.get(job) or self._open_job(job, spider)
        try:
            self.item_scraped(item, spider)
            self.job_slots[job] = self.slots
        finally:
            self.slots, self._job = shared, ""

    async def store_job_feeds(self, job_id: str, stats: dict[str, Any], spider: Spider) -> None:
        """On ``job_finished``: store the job's files."""
        for slot in self.job_slots.pop(job_id, []):
            await self._close_slot(slot, spider)
        await self.store_orphans(spider, job_id)

    async def store_orphans(self, spider: Spider, job: str | None) -> None:
        """Store the spool files that processes which died left (of ``job``, or of any job)."""
        refused = self.spool.refused
        orphans = self.spool.orphans(job)
        if self.spool.refused > refused:  # links, files of other users: logged by orphans()
            self.crawler.stats.inc_value("feedexport/spool/refused", self.spool.refused - refused)
        for where, file in orphans:
            why = self._refusal(where, spider)
            if why:
                logger.warning("feed spool file %s left alone: %s", file.name, why)
                self.crawler.stats.inc_value("feedexport/spool/refused")
                file.close()
                continue
            await self._store_orphan(where["uri"], self.feeds[where["template"]], file, spider)

    def _refusal(self, where: dict[str, str], spider: Spider) -> str:
        """Why a record is not stored by this crawler, or ``""``: its URI must be one that a
        job feed of this crawler on a remote storage renders for its job."""
        template, uri = where["template"], where["uri"]
        if template not in self.job_feeds or not is_remote(template):
            return f"{template!r} is not a job feed of this crawler on a remote storage"
        self._job = where["job"]
        try:
            params = self._get_uri_params(spider, self.feeds[template]["uri_params"])
        finally:
            self._job = ""
        rendered, named = urlparse(apply_uri_params(template, params)), urlparse(uri)
        if (named.scheme, named.netloc) != (rendered.scheme, rendered.netloc):
            return f"{uri!r} is not on the storage of its feed {template!r}"
        if not fits(uri, template):
            return f"{uri!r} is not a URI its feed {template!r} renders"
        return ""

    async def _store_orphan(
        self, uri: str, options: dict[str, Any], file: IO[bytes], spider: Spider
    ) -> None:
        data = Path(file.name)
        held = os.dup(file.fileno())  # S3, GCS and FTP close the file: the lock stays till removal
        try:
            file.seek(0)
            stored = self._get_storage(uri, options).store(file)
            if stored is not None:
                await maybe_deferred_to_future(stored)
        except Exception:
            file.close()
            os.close(held)
            logger.exception("the feed part of a process that died was not stored in %s", uri)
            self.crawler.stats.inc_value("feedexport/spool/failed")
            return
        remove_spooled(data)
        os.close(held)
        logger.info("stored the feed part of a process that died in %s", uri)
        self.crawler.stats.inc_value("feedexport/spool/stored")

    async def close_spider(self, spider: Spider) -> None:
        """The worker stops: the files of jobs still open are stored as they are."""
        for slots in self.job_slots.values():
            for slot in slots:
                self._schedule_slot_close(slot, spider)
        self.job_slots.clear()
        await super().close_spider(spider)

    def settle(self) -> None:
        """``acks_due``: what the exporters wrote is handed to the OS before its pages are acked.

        Once per write of acks, not per item. A local file then holds the items
        of every acked page even if the process is killed; so does the spool
        file of a job's feed on a remote storage, which another process stores.
        """
        for slot in itertools.chain(self.slots, *self.job_slots.values()):
            if slot.file is not None and not slot.file.closed:
                slot.file.flush()

    def item_scraped(self, item: Any, spider: Spider) -> None:
        """Scrapy's, over ``self.slots``: the spider's feeds, or one job's."""
        if self.slots:
            super().item_scraped(item, spider)

    def _open_job(self, job: str, spider: Spider) -> list[FeedSlot]:
        return [self._new_slot(uri, self.feeds[uri], spider) for uri in self.job_feeds]

    def _start_new_batch(
        self,
        batch_id: int,
        uri: str,
        feed_options: dict[str, Any],
        spider: Spider,
        uri_template: str,
    ) -> FeedSlot:
        """Scrapy's; a job's file on a remote storage is a spool file, which others may store."""
        slot = super()._start_new_batch(batch_id, uri, feed_options, spider, uri_template)
        if self._job and isinstance(slot.storage, BlockingFeedStorage):
            slot.storage = self.spool.wrap(
                slot.storage, uri=uri, template=uri_template, job=self._job
            )
        return slot

    def _new_slot(self, uri: str, feed_options: dict[str, Any], spider: Spider) -> FeedSlot:
        params = self._get_uri_params(spider, feed_options["uri_params"])
        return self._start_new_batch(
            batch_id=1,
            uri=apply_uri_params(uri, params),
            feed_options=feed_options,
            spider=spider,
            uri_template=uri,
        )

    def _get_uri_params(
        self, spider: Spider, uri_params_function: Any, slot: FeedSlot | None = None
    ) -> dict[str, Any]:
        params = super()._get_uri_params(spider, uri_params_function, slot)
        params["job"] = self._job
        params["worker"] = self.worker
        return params
