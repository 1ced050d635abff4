"""A Scrapy project of many spiders, as real projects have (``MANY_SPIDERS``, 40 by default).

Every spider follows the links of the site it is pointed at and makes an item
of each page; they differ only by name (``link_pages_00`` ...). A worker
hosting the whole project hosts one crawler per spider, most of them idle.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, ClassVar

from scrapy import Request, Spider
from scrapy.http import Response

SPIDER_COUNT = int(os.environ.get("MANY_SPIDERS", "40"))


def spider_name(n: int) -> str:
    return f"link_pages_{n:02d}"


class LinkPagesSpider(Spider):
    name = spider_name(0)
    custom_settings: ClassVar[dict[str, Any]] = {
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
    }

    def parse(self, response: Response) -> Iterator[dict[str, Any] | Request]:
        yield {"url": response.url, "spider": self.name}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href)


for _n in range(1, SPIDER_COUNT):
    globals()[f"LinkPagesSpider{_n:02d}"] = type(
        f"LinkPagesSpider{_n:02d}",
        (LinkPagesSpider,),
        {"name": spider_name(_n), "__module__": __name__},
    )
