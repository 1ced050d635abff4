"""A spider file for ``scrapy runspider``, whose Item class is defined in the same file.

    scrapy runspider tests/support/runspider_item.py -a url=SITE_URL/page/1.html

The start page's item travels in ``meta`` to each page it links to, which
completes it: the codec must allow this file's module (the spider's own),
which no ``SPIDER_MODULES`` names.
"""

from __future__ import annotations

from collections.abc import Iterator

import scrapy
from scrapy.http import Response


class LinkItem(scrapy.Item):
    source = scrapy.Field()
    target = scrapy.Field()


class RunSpider(scrapy.Spider):
    name = "runspider_item"

    def __init__(self, url: str = "", **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.start_urls = [url]

    def parse(self, response: Response) -> Iterator[scrapy.Request]:
        for href in response.css("ul a::attr(href)").getall():
            item = LinkItem(source=response.url)
            yield response.follow(href, callback=self.parse_target, meta={"item": item})

    def parse_target(self, response: Response) -> Iterator[LinkItem]:
        item = response.meta["item"]
        item["target"] = response.url
        yield item
