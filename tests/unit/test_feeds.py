"""Feeds per job: the part that needs no worker (the rest: tests/integration/test_job_end.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from scrapy.extensions.feedexport import FeedExporter

from celery_crawl.errors import ConfigError
from celery_crawl.feeds import JobFeedExporter, Spool
from tests.support.job_hooks import FolderFeedStorage


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
    file.close()  # what a kill does to the lock
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
