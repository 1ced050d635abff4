"""The forum application that ``celery-crawl demo`` runs, shipped in the wheel.

It sits above the library (the example layer of docs/architecture.md): it is
built on ``celery_crawl`` as any application is, and no library module imports
it. It ships with the library so that ``pip install "celery-crawl[demo]"`` is
all the demo needs, from any folder:

- ``settings`` and ``spiders``: the forum crawler, a Scrapy project
  (``feeds``: one items file per worker process);
- ``celery``: its Celery app, found by ``celery -A celery_crawl.demo``
  and ``celery-crawl status -A celery_crawl.demo`` (loaded on first use, so
  that the site and the runner need no app);
- ``site``: the demo forum it crawls (``celery-crawl site``);
- ``runner``: everything at once (``celery-crawl demo``).

``celery-crawl site`` and ``celery-crawl demo`` are added through the
``celery_crawl.commands`` entry points. The checkout's ``tasks/`` is the same
application as a project of yours would hold it (``celery -A tasks worker``).
"""

from celery_crawl.core.exports import lazy

__getattr__ = lazy("celery_crawl.demo", {"app": "celery_crawl.demo.celery"})
