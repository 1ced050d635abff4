"""The forum application's Celery app, as in Celery's ``proj/celery.py`` layout."""

from celery_crawl import create_app

app = create_app("celery_crawl.demo", "celery_crawl.demo.settings")
