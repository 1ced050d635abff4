"""The forum application: a Celery app whose workers crawl forums.

Run a worker, which hosts the forum crawlers::

    celery -A tasks worker

Then, from application code::

    import tasks
    from celery_crawl import crawl

    crawl("forum", [{"forum_id": "00001"}]).wait(60)
"""

from celery_crawl import create_app

app = create_app("tasks", "tasks.settings")
