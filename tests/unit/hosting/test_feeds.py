"""Feeds per job: the part that needs no worker (the rest: tests/integration/test_job_end.py)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

import pytest
from scrapy import Request
from scrapy.extensions.feedexport import FeedExporter
from scrapy.http import HtmlResponse
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from celery_crawl.core.errors import ConfigError
from celery_crawl.hosting.feeds import SPOOL_FOLDER, JobFeedExporter, Spool
from celery_crawl.jobs.signals import JOB_META
from tests.support.job_hooks import FolderFeedStorage
from tests.support.stub_spider import ForumSpider

FORMAT = {"format": "jsonlines"}


def test_job_feeds_are_told_apart_from_the_spiders(make_crawler: Any, tmp_path: Any) -> None:
    feeds = {
        str(tmp_path / "%(job)s-%(worker)s.jsonl"): {"format": "jsonlines"},
        str(tmp_path / "all.jsonl"): {"format": "jsonlines"},
    }
    exporter = JobFeedExporter(make_crawler(FEEDS=feeds))
    assert exporter.job_feeds == [str(tmp_path / "%(job)s-%(worker)s.jsonl")]


def test_a_scrapy_without_the_methods_it_builds_on_is_refused_at_start(
    make_crawler: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(FeedExporter, "_close_slot")
    feeds = {str(tmp_path / "%(job)s.jsonl"): {"format": "jsonlines"}}
    with pytest.raises(ConfigError, match=r"FeedExporter has no _close_slot.*Scrapy 2\.19"):
        JobFeedExporter(make_crawler(FEEDS=feeds))


def test_a_spool_file_is_claimed_only_once_no_process_holds_it(tmp_path: Path) -> None:
    """A process's open spool file is locked: no one else stores it until the lock goes
    (its process died); then one claimer gets it, with where it goes."""
    spool = Spool(tmp_path / "spool")
    spool.prepare()
    uri = f"folder://{tmp_path}/job-1-host-1.jsonl"
    storage = spool.wrap(FolderFeedStorage(uri), uri=uri, template="folder://%(job)s", job="1")
    file = storage.open(cast("Any", None))
    file.write(b'{"path": "/a"}\n')
    file.flush()
    assert spool.orphans(None) == []  # held by its (living) writer
    file.close()
    os.close(storage.held)  # what a kill does to the lock: every descriptor of it goes
    assert spool.orphans("another job") == []
    ((where, claimed),) = spool.orphans("1")
    assert where == {"uri": uri, "template": "folder://%(job)s", "job": "1"}
    assert claimed.read() == b'{"path": "/a"}\n'
    assert spool.orphans(None) == []  # claimed: the next claimer finds it locked
    claimed.close()


def test_a_spool_folder_others_can_write_to_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(ConfigError, match="must belong to this user alone"):
        Spool(folder).prepare()


class PendingFolderStorage(FolderFeedStorage):
    """A remote storage caught mid-store: its thread wrote the file and closed it (as S3,
    GCS and FTP do), and the reactor has not run the callbacks yet."""

    pending: Deferred[None]

    def store(self, file: IO[bytes]) -> Deferred[None]:
        self._store_in_thread(file)
        PendingFolderStorage.pending = Deferred()
        return PendingFolderStorage.pending


def spool_crawler(make_crawler: Any, tmp_path: Path, **feeds: dict[str, Any]) -> Any:
    storages = {"folder": FolderFeedStorage, "otherfolder": FolderFeedStorage}
    return make_crawler(
        FEEDS=feeds,
        FEED_STORAGES={**storages, "pending": PendingFolderStorage},
        FEED_TEMPDIR=str(tmp_path / "tmp"),
        STATS_CLASS="scrapy.statscollectors.MemoryStatsCollector",
    )


def leave_spool_file(folder: Path, record: dict[str, str], data: bytes = b"items\n") -> Path:
    """What a process that died leaves: a ``.part`` no one holds and its record."""
    (folder / "left.part").write_bytes(data)
    (folder / "left.json").write_text(json.dumps(record))
    return folder / "left.part"


def store_orphans(exporter: JobFeedExporter, job: str | None) -> Any:
    spider = ForumSpider.from_crawler(exporter.crawler)
    asyncio.run(exporter.store_orphans(spider, job))
    return exporter.crawler.stats


def test_a_crawler_without_remote_job_feeds_reads_no_spool_folder(
    make_crawler: Any, tmp_path: Path
) -> None:
    """Only a folder checked to be this user's alone is read: a crawler whose only remote feed
    is not per job never checks it, so never reads it."""
    target = tmp_path / "all.jsonl"
    template = f"folder://{target}"
    exporter = JobFeedExporter(spool_crawler(make_crawler, tmp_path, **{template: FORMAT}))
    folder = tmp_path / "tmp" / SPOOL_FOLDER
    folder.mkdir(parents=True)
    folder.chmod(0o777)  # as another user could have made it
    stolen = tmp_path / "stolen.jsonl"
    part = leave_spool_file(folder, {"uri": f"folder://{stolen}", "template": template, "job": "1"})
    store_orphans(exporter, "1")
    assert not stolen.exists()
    assert part.exists()


def remote_job_exporter(make_crawler: Any, tmp_path: Path) -> tuple[JobFeedExporter, str]:
    template = f"folder://{tmp_path}/feeds/%(job)s-%(worker)s.jsonl"
    (tmp_path / "feeds").mkdir()
    return JobFeedExporter(spool_crawler(make_crawler, tmp_path, **{template: FORMAT})), template


@pytest.mark.parametrize(
    "uri",
    [
        "otherfolder://{tmp}/feeds/1-host-1.jsonl",  # the same template, another storage
        "folder://attacker{tmp}/feeds/1-host-1.jsonl",  # another host
        "folder://{tmp}/stolen/1-host-1.jsonl",  # a URI the template does not render
    ],
)
def test_a_record_whose_uri_its_template_does_not_render_is_left_alone(
    make_crawler: Any, tmp_path: Path, uri: str
) -> None:
    exporter, template = remote_job_exporter(make_crawler, tmp_path)
    (tmp_path / "stolen").mkdir()
    named = uri.format(tmp=tmp_path)
    part = leave_spool_file(exporter.spool.folder, {"uri": named, "template": template, "job": "1"})
    stats = store_orphans(exporter, "1")
    assert not list((tmp_path / "feeds").iterdir())
    assert not list((tmp_path / "stolen").iterdir())
    assert part.exists()
    assert stats.get_value("feedexport/spool/refused") == 1
    assert stats.get_value("feedexport/spool/stored") is None


@pytest.mark.parametrize("link", [os.symlink, os.link])
def test_a_spool_file_that_is_a_link_to_another_file_is_left_alone(
    make_crawler: Any, tmp_path: Path, link: Callable[[Path, Path], None]
) -> None:
    """A link to ``~/.aws/credentials`` in the folder is not uploaded."""
    exporter, template = remote_job_exporter(make_crawler, tmp_path)
    credentials = tmp_path / "credentials"
    credentials.write_text("secret\n")
    folder = exporter.spool.folder
    target = tmp_path / "feeds" / "1-host-1.jsonl"
    record = {"uri": f"folder://{target}", "template": template, "job": "1"}
    (folder / "left.json").write_text(json.dumps(record))
    link(credentials, folder / "left.part")
    stats = store_orphans(exporter, "1")
    assert not target.exists()
    assert (folder / "left.part").exists()
    assert stats.get_value("feedexport/spool/refused") == 1


def test_a_record_its_crawler_renders_is_stored(make_crawler: Any, tmp_path: Path) -> None:
    exporter, template = remote_job_exporter(make_crawler, tmp_path)
    target = tmp_path / "feeds" / "1-host-1.jsonl"
    record = {"uri": f"folder://{target}", "template": template, "job": "1"}
    leave_spool_file(exporter.spool.folder, record)
    stats = store_orphans(exporter, "1")
    assert stats.get_value("feedexport/spool/stored") == 1
    assert target.read_bytes() == b"items\n"
    assert not list(exporter.spool.folder.iterdir())


def test_a_symbolic_link_as_spool_folder_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (tmp_path / "tmp").symlink_to(mine)
    with pytest.raises(ConfigError, match="not a symbolic link"):
        Spool(tmp_path / "tmp").prepare()


def test_a_spool_file_being_stored_stays_locked_until_it_is_removed(tmp_path: Path) -> None:
    """S3, GCS and FTP close the file in their thread; the removal runs later in the reactor.
    No other process claims it (and uploads it again, or appends it twice with FTP's
    ``overwrite: False``) in between."""
    spool = Spool(tmp_path / "spool")
    spool.prepare()
    uri = f"pending://{tmp_path}/job-1-host-1.jsonl"
    storage = spool.wrap(PendingFolderStorage(uri), uri=uri, template="pending://", job="1")
    file = storage.open(cast("Any", None))
    file.write(b'{"path": "/a"}\n')
    stored = storage.store(file)
    assert file.closed
    assert spool.orphans(None) == []  # stored, not yet removed: still held
    PendingFolderStorage.pending.callback(None)
    assert spool.orphans(None) == []
    assert not list(spool.folder.iterdir())
    assert (tmp_path / "job-1-host-1.jsonl").read_bytes() == b'{"path": "/a"}\n'
    assert stored.called


def test_a_failed_store_releases_the_spool_file(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.prepare()
    uri = f"pending://{tmp_path}/job-1-host-1.jsonl"
    storage = spool.wrap(PendingFolderStorage(uri), uri=uri, template="pending://", job="1")
    stored = storage.store(storage.open(cast("Any", None)))
    failures: list[Failure] = []
    stored.addErrback(failures.append)
    PendingFolderStorage.pending.errback(OSError("upload failed"))
    assert [f.getErrorMessage() for f in failures] == ["upload failed"]
    ((_, claimed),) = spool.orphans(None)  # kept, for the next process to store
    claimed.close()


def test_an_orphan_being_stored_stays_locked_until_it_is_removed(
    make_crawler: Any, tmp_path: Path
) -> None:
    template = f"pending://{tmp_path}/feeds/%(job)s-%(worker)s.jsonl"
    (tmp_path / "feeds").mkdir()
    exporter = JobFeedExporter(spool_crawler(make_crawler, tmp_path, **{template: FORMAT}))
    target = tmp_path / "feeds" / "1-host-1.jsonl"
    record = {"uri": f"pending://{target}", "template": template, "job": "1"}
    leave_spool_file(exporter.spool.folder, record)
    spider = ForumSpider.from_crawler(exporter.crawler)
    other = Spool(exporter.spool.folder)
    other.prepare()

    async def store_while_another_process_looks() -> list[Any]:
        storing = asyncio.ensure_future(exporter.store_orphans(spider, "1"))
        for _ in range(100):  # until the storage's thread has written and closed the file
            if target.exists():
                break
            await asyncio.sleep(0)
        claimed_meanwhile = other.orphans(None)
        PendingFolderStorage.pending.callback(None)
        await storing
        return claimed_meanwhile

    assert asyncio.run(store_while_another_process_looks()) == []
    assert target.read_bytes() == b"items\n"
    assert not list(exporter.spool.folder.iterdir())


def test_scrapy_counts_a_spooled_feed_under_its_storage_class(
    make_crawler: Any, tmp_path: Path
) -> None:
    """``feedexport/success_count/FolderFeedStorage``, as without the spool."""
    exporter, _ = remote_job_exporter(make_crawler, tmp_path)
    spider = ForumSpider.from_crawler(exporter.crawler)
    request = Request("http://127.0.0.1/a", meta={JOB_META: "1"})
    response = HtmlResponse("http://127.0.0.1/a", request=request)
    exporter.route_item({"path": "/a"}, response, spider)
    (slot,) = exporter.job_slots["1"]
    assert type(slot.storage).__name__ == "FolderFeedStorage"
    asyncio.run(exporter.store_job_feeds("1", {}, spider))
    stats = exporter.crawler.stats
    assert stats.get_value("feedexport/success_count/FolderFeedStorage") == 1
    assert stats.get_value("feedexport/success_count/SpooledStorage") is None
