"""A second spider that renders every page, so that one worker process hosts two
(tests/integration/test_browser.py: they share one browser and its page cap).

It uses the rest of scrapy-playwright's request API, as a user's spider would: a page
method on every page (its result read back), and the page itself handed to the post's
callback (``playwright_include_page``), which reads the title from it and closes it, as
does the errback of a post that fails (a deleted one's 404)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request
from scrapy.http import Response
from scrapy_playwright.page import PageMethod
from twisted.python.failure import Failure

from celery_crawl.demo.browser_spiders import ForumJsSpider


class ForumJsTwinSpider(ForumJsSpider):
    name = "forum_js_twin"

    def rendered(self, url: str, callback: Any) -> Request:
        request = super().rendered(url, callback)
        methods = [PageMethod("evaluate", "document.querySelectorAll('main *').length")]
        request.meta["playwright_page_methods"] = methods
        if callback == self.parse_post:
            request.meta["playwright_include_page"] = True
            return request.replace(errback=self.close_page)
        return request

    async def parse_post(self, response: Response) -> AsyncIterator[dict[str, Any]]:  # type: ignore[override]
        page = response.meta["playwright_page"]
        try:
            heading = await page.inner_text("h1.title")
        finally:
            await page.close()
        elements = response.meta["playwright_page_methods"][0].result
        for item in super().parse_post(response):
            yield {**item, "heading": heading, "elements": elements}

    async def close_page(self, failure: Failure) -> None:
        page = failure.request.meta.get("playwright_page")  # type: ignore[attr-defined]
        if page is not None:
            await page.close()
