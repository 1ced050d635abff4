"""Scrapy settings of the forum application: the forum crawler's, reused.

The spiders and their settings ship in the wheel (``celery_crawl.demo.settings``,
with ``SPIDER_MODULES = ["celery_crawl.demo.spiders"]``), so that the demo runs
without a checkout; this app starts from them, as a project of yours starts from
Scrapy's defaults, and is the place to change them. ``REDIS_URL`` and the
settings listed in ``CELERY_CRAWL_ENV`` are taken from the environment when set
there.
"""

from celery_crawl.demo.settings import *  # noqa: F403
