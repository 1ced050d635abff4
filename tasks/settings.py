"""Scrapy settings of the forum application (REDIS_URL comes from the environment)."""

import os

BOT_NAME = "forum"
SPIDER_MODULES = ["tasks.spiders"]
FORUM_BASE_URL = os.environ.get("FORUM_BASE_URL", "http://127.0.0.1:8000")

CONCURRENT_REQUESTS = 32
CONCURRENT_REQUESTS_PER_DOMAIN = 32
DOWNLOAD_TIMEOUT = 30
RETRY_TIMES = 3
HTTPERROR_ALLOWED_CODES: list[int] = []
ROBOTSTXT_OBEY = False
LOG_LEVEL = "INFO"
FEEDS = {
    os.environ.get("FORUM_FEED", "items/%(name)s-%(pid)s.jsonl"): {"format": "jsonlines"},
}
FEED_URI_PARAMS = "tasks.feeds.uri_params"
