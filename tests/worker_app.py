"""The Celery app the test workers run: ``celery -A worker_app worker``."""

from celery_crawl import create_app

app = create_app("worker_app", "worker_settings")
