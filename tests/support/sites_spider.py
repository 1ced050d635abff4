"""A spider of the kind a Scrapy team brings: plain pages from seed URLs, on any site.

Each seed is a URL (or ``{"url": ...}``); each page becomes an item. The
politeness tests point its jobs at two sites at once, one of them limited.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from scrapy import Spider
from scrapy.http import Response


class SitePagesSpider(Spider):
    name = "site_pages"
    custom_settings: ClassVar[dict[str, Any]] = {
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
        "HTTPERROR_ALLOW_ALL": True,  # a 404 or a 429 is still a page of the site, counted
    }

    def parse(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {"url": response.url, "status": response.status}


class RobotsPagesSpider(SitePagesSpider):
    """The same, obeying robots.txt (tests/integration/test_robots.py)."""

    name = "robots_pages"
    custom_settings: ClassVar[dict[str, Any]] = {
        **SitePagesSpider.custom_settings,
        "ROBOTSTXT_OBEY": True,
    }
