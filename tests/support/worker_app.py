"""The Celery app the test workers run: ``celery -A tests.support.worker_app worker``."""

from celery_crawl import create_app

app = create_app("worker_app", "tests.support.worker_settings")
