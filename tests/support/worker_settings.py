"""Settings of the test worker app: the forum app plus the test spiders."""

from tasks.settings import *  # noqa: F403

SPIDER_MODULES = [
    "celery_crawl.demo.spiders",
    "tests.support.paths_spider",
    "tests.support.kinds_spiders",
    "tests.support.hosted_members",
    "tests.support.job_hooks",
    "tests.support.sites_spider",
    "tests.support.fault_spider",
]
# of the spider kinds, only the CrawlSpider runs hosted: an idle hosted crawler keeps a
# reactor thread waiting for work, so the workers host no crawler that no test uses
CELERY_CRAWL_SPIDERS = [
    "forum",
    "forum_detail",
    "paths",
    "paths_start",
    "paths_jobs",
    "kind_crawl",
    "hosted_members",
    "hosted_members_local",
    "site_pages",
    "robots_pages",
    "fault_tree",
]
SCHEDULER_LEASE_SECONDS = 4
SCHEDULER_REQUEUE_INTERVAL = 1
CELERY_CRAWL_PROGRESS_INTERVAL = 0.5
LOG_LEVEL = "INFO"
TEST_ENV = [
    "PATHS_BASE_URL",
    "JOB_FEED_DIR",
    "JOB_FEED_SCHEME",
    "FEED_TEMPDIR",
    "PRODUCER_PERIOD",
    "PRODUCER_SPIDERS",  # tests/integration/test_schedule_many.py
    "PRODUCER_JOB_CAP",
    "CELERY_CRAWL_GC_FREEZE",
    "CELERY_CRAWL_GC_THRESHOLD",
    "REDIS_PARAMS",
    "CELERY_CRAWL_ALLOW_EVICTION",  # tests/faults/test_out_of_memory.py
    # the live-worker tests run with the default lease and heartbeat times
    "SCHEDULER_LEASE_SECONDS",
    "SCHEDULER_REQUEUE_INTERVAL",
    "CELERY_CRAWL_HEARTBEAT_SECONDS",
    # the politeness tests: sites' limits
    "SITE_CONCURRENCY",
    "SITE_RATE",
    "SITE_OVERRIDES",
    "SITE_LIMITS_ENABLED",
    "SITE_BACKOFF_SECONDS",
    # the fault-injection suite: where a process stops (tests/support/fault_spider.py)
    "FAULT_STEP",
    "FAULT_TRIGGER",
    "FAULT_MARKER",
    # a warm shutdown while the engines start (tests/integration/test_jobs.py)
    "ENGINE_START_GATE",
]
CELERY_CRAWL_ENV = [*CELERY_CRAWL_ENV, *TEST_ENV]  # noqa: F405
PATHS_BASE_URL = ""
JOB_FEED_DIR = ""  # paths_jobs: where its per-job feeds and hook records go
JOB_FEED_SCHEME = ""  # paths_jobs: "folder" stores its feeds as a remote storage does
FAULT_STEP = FAULT_TRIGGER = FAULT_MARKER = ""  # fault_tree: none by default
EXTENSIONS = {"tests.support.slow_start.SlowEngineStart": 0}
ENGINE_START_GATE = ""  # a file the engines wait for; "": the extension is off
