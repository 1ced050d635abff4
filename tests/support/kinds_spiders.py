"""One spider of each generic kind Scrapy ships, written as ordinary Scrapy user code.

They crawl :mod:`tests.support.static_site` and know nothing of celery_crawl:
the scheduler must run them unchanged. Each one's requests carry callbacks
that Scrapy's own classes make private (``CrawlSpider._callback`` and
``_errback``, ``SitemapSpider._parse_sitemap``) or the spider's own methods
with ``cb_kwargs``. Every item is one page: ``{"url": ..., "title": ...}``,
plus the feed item's ``id`` for the feed spiders.

- ``kind_crawl``: a ``CrawlSpider`` from ``/``, one rule that follows every
  page link (the home link is left out: ``/`` is the start URL, fetched with
  ``dont_filter``, so following it would fetch it again, in Scrapy too);
- ``kind_sitemap``: a ``SitemapSpider`` over ``/sitemap.xml``;
- ``kind_xmlfeed``: an ``XMLFeedSpider`` over ``/feed.xml`` (``<item>`` nodes);
- ``kind_csvfeed``: a ``CSVFeedSpider`` over ``/feed.csv``.

The start URLs are spider arguments (``start_urls``, or ``sitemap_urls``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor
from scrapy.selector import Selector
from scrapy.spiders import CrawlSpider, CSVFeedSpider, Rule, SitemapSpider, XMLFeedSpider


def page_item(response: Response, **fields: str) -> dict[str, Any]:
    return {"url": response.url, "title": response.css("title::text").get(), **fields}


class KindCrawlSpider(CrawlSpider):
    name = "kind_crawl"
    rules = (
        Rule(
            LinkExtractor(allow=r"/page/\d+\.html$"),
            callback="parse_page",
            errback="page_failed",
            follow=True,
        ),
    )

    def parse_page(self, response: Response) -> Iterator[dict[str, Any]]:
        yield page_item(response)

    def page_failed(self, failure: Any) -> None:
        self.logger.error("page failed: %s", failure)


class KindSitemapSpider(SitemapSpider):
    name = "kind_sitemap"
    sitemap_rules = ((r"/page/", "parse_page"),)

    def parse_page(self, response: Response) -> Iterator[dict[str, Any]]:
        yield page_item(response)


class KindXmlFeedSpider(XMLFeedSpider):
    name = "kind_xmlfeed"
    itertag = "item"

    def parse_node(self, response: Response, selector: Selector) -> Iterator[Request]:
        link = selector.xpath("link/text()").get() or ""
        item_id = selector.xpath("id/text()").get() or ""
        yield Request(link, callback=self.parse_page, cb_kwargs={"item_id": item_id})

    def parse_page(self, response: Response, item_id: str) -> Iterator[dict[str, Any]]:
        yield page_item(response, id=item_id)


class KindCsvFeedSpider(CSVFeedSpider):
    name = "kind_csvfeed"

    def parse_row(self, response: Response, row: dict[str, str]) -> Iterator[Request]:
        yield Request(row["link"], callback=self.parse_page, cb_kwargs={"item_id": row["id"]})

    def parse_page(self, response: Response, item_id: str) -> Iterator[dict[str, Any]]:
        yield page_item(response, id=item_id)


KINDS: dict[str, type[Spider]] = {
    spider.name: spider
    for spider in (KindCrawlSpider, KindSitemapSpider, KindXmlFeedSpider, KindCsvFeedSpider)
}
