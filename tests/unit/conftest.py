"""Fixtures of the unit tests: they talk to the shared Redis and start no process."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy import Spider

from tests.support.stub_spider import ForumSpider


@pytest.fixture
def spider(make_crawler: Any) -> Spider:
    crawler = make_crawler()
    return ForumSpider.from_crawler(crawler)
