"""The Celery app of a worker hosting the browser spider."""

from celery_crawl import create_app

app = create_app("browser_app", "tests.support.browser_settings")
