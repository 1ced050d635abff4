"""A spider whose callbacks do nothing: the scheduler, dedup and serializer tests crawl with it."""

from __future__ import annotations

from typing import Any

from scrapy import Spider


class ForumSpider(Spider):
    name = "forum"

    def parse(self, response: Any) -> None:
        pass

    def parse_post(self, response: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass

    def _private(self, response: Any) -> None:
        pass
