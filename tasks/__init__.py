"""The forum application: a Celery app whose workers crawl forums.

Run a worker, which hosts the forum crawlers::

    celery -A tasks worker

Then, from application code::

    import tasks
    from celery_crawl import crawl

    crawl("forum", [{"forum_id": "00001"}]).wait(60)

This is the example application of the checkout, laid out as a project of
yours would be: the Celery app here, its Scrapy settings in ``tasks.settings``.
It is not installed: the forum crawler it runs (spiders, settings, the demo
forum site, ``celery-crawl demo``) ships in the wheel as
:mod:`celery_crawl.demo`, which it reuses; see docs/example.md.
"""

from celery_crawl import create_app

app = create_app("tasks", "tasks.settings")
