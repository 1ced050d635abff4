"""A plain Celery app beside a celery_crawl app, in one module (see test_wiring)."""

import os
import time

from celery import Celery

from celery_crawl import create_app
from tests.support.workers import WORKER_SETTINGS

crawl_app = create_app("worker_app", WORKER_SETTINGS)
plain = Celery("plain", broker=os.environ["REDIS_URL"], backend=os.environ["REDIS_URL"])


@plain.task(name="plain.nap")
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
