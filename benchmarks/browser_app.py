"""The Celery app of the browser benchmark's worker (benchmarks/browser.py)."""

from celery_crawl import create_app

app = create_app("browser_bench", "benchmarks.browser_settings")
