"""The forum app's settings for the benchmark: items go to JSON-lines files."""

from benchmarks.many_spiders import IDLE_NAMES
from tasks.settings import *  # noqa: F403

LOG_LEVEL = "INFO"

# the anchors run one spider at concurrency 32 per process: so does celery_crawl. Its
# workers host the forum app's two spiders, and with BENCH_HOSTED_SPIDERS, idle ones
# beside them (benchmarks/many_spiders.py), as a worker of a larger project does.
FORUM_DETAIL_SPIDER = None
SPIDER_MODULES = [*SPIDER_MODULES, "benchmarks.many_spiders"]  # noqa: F405
CELERY_CRAWL_SPIDERS = ["forum", "forum_detail", *IDLE_NAMES]

# the sites are unlimited, but the per-site limiter runs: every lease counts against a cap
# that is never reached, and every download passes the site check. The system
# "celery_crawl, no site limits" turns it off (SITE_LIMITS_ENABLED from the environment),
# so the table shows what the limiter costs.
SITE_CONCURRENCY = 1000
SITE_RATE = 0.0
# the dedup benchmark (benchmarks/dedup_rolling.py) runs each filter from the environment
CELERY_CRAWL_ENV = [
    *CELERY_CRAWL_ENV,  # noqa: F405
    "SITE_LIMITS_ENABLED",
    "DUPEFILTER_CLASS",
    "DUPEFILTER_EXPIRE_SECONDS",
    "DUPEFILTER_EXPIRE_CRAWLS",
]

# the freshness benchmark starts a job per forum at each tick it is due: none held back
PRODUCER_JOB_CAP = 1000
