"""Benchmarks: each runs celery_crawl and scrapy-redis 0.9.1 in one run, on one Redis."""
