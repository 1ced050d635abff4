"""The forum app's settings for the benchmark: items go to JSON-lines files."""

from tasks.settings import *  # noqa: F403

LOG_LEVEL = "INFO"

# the anchors run one spider at concurrency 32 per process: so does celery_crawl
FORUM_DETAIL_SPIDER = None
CELERY_CRAWL_SPIDERS = ["forum"]
