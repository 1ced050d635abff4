"""The forum application: a Celery app whose workers crawl forums.

Run a worker, which hosts the forum crawlers::

    celery -A tasks worker

Then, from application code::

    import tasks
    from celery_crawl import crawl

    crawl("forum", [{"forum_id": "00001"}]).wait(60)

This package is the example that ships beside the library, which never
imports it: ``tasks.site`` is the demo forum it crawls (``python -m
tasks.site``), and ``tasks.demo`` runs everything at once. Both add a
``celery-crawl`` command (``site``, ``demo``) through the library's
``celery_crawl.commands`` entry points; see docs/example.md.
"""

from celery_crawl import create_app

app = create_app("tasks", "tasks.settings")
