"""Settings path ``celery_crawl.fingerprint.*``, the request fingerprinter.

The code lives in :mod:`celery_crawl.codec.fingerprint`.
"""

from celery_crawl.codec.fingerprint import VersionedRequestFingerprinter

__all__ = ["VersionedRequestFingerprinter"]
