"""A script that starts a job, asks its Celery result once, and exits (see test_jobs)."""

from celery.exceptions import TimeoutError as ResultTimeout

from celery_crawl import crawl, create_app
from tests.support.workers import WORKER_SETTINGS

app = create_app("worker_app", WORKER_SETTINGS)
job = crawl("paths", [{"chain": "x", "length": 1}], app=app)
try:
    job.result.get(timeout=0.5)  # no worker runs: the result consumer subscribes, then times out
except ResultTimeout:
    print("no result yet")
job.cancel()
