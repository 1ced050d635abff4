"""The Celery app the end-to-end benchmark's workers run."""

from celery_crawl import create_app

app = create_app("bench_app", "benchmarks.bench_settings")
