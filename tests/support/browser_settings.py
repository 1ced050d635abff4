"""Settings of a worker that hosts the browser spiders (celery_crawl/demo/browser_spiders.py) only:
no other test's worker starts a Playwright driver."""

from tests.support.worker_settings import *  # noqa: F403

SPIDER_MODULES = [
    "celery_crawl.demo.browser_spiders",
    "celery_crawl.demo.mixed_spiders",
    "tests.support.browser_spiders",
]
CELERY_CRAWL_SPIDERS = ["forum_js", "forum_mixed", "forum_js_twin"]
CELERY_CRAWL_SPIDER_GROUPS: dict[str, str] = {}
CELERY_CRAWL_QUEUES: dict[str, str] = {}
PRODUCER_SPIDERS: list[str] = []
BROWSER_RENDER_TIMEOUT = 20.0  # a render that a crashed browser left waiting: retried soon
# the browser tests set these per worker: the recycling and deadline tests, and Chromium's
# launch options
CELERY_CRAWL_ENV = [
    *CELERY_CRAWL_ENV,  # noqa: F405
    "BROWSER_RECYCLE_PAGES",
    "BROWSER_RECYCLE_MEMORY_MB",
    "BROWSER_MAX_PAGES",
    "PLAYWRIGHT_LAUNCH_OPTIONS",  # one renderer process per browser (test_browser.py)
    # the test of renders past their deadline
    "BROWSER_RENDER_TIMEOUT",
    "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT",
    "RETRY_TIMES",
]
