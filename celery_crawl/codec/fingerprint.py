"""Request fingerprints that carry a version, for incremental crawls.

``REQUEST_FINGERPRINTER_CLASS = "celery_crawl.fingerprint.VersionedRequestFingerprinter"``.

A request with ``meta["dedup_version"]`` (e.g. a post's comment count and last
activity, as its listing shows them) gets a fingerprint of its URL *and* that
version: the same page is fetched again when, and only when, the version
changes. Other requests keep Scrapy's default fingerprint.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Self

from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

VERSION_META = "dedup_version"


class VersionedRequestFingerprinter:
    def __init__(self, crawler: Crawler | None = None) -> None:
        self.default = RequestFingerprinter(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def fingerprint(self, request: Request) -> bytes:
        base = self.default.fingerprint(request)
        version = request.meta.get(VERSION_META)
        if version is None:
            return base
        return hashlib.sha1(base + b"\0" + str(version).encode()).digest()
