"""A spider whose pages need a browser: the demo forum's script-built pages
(``celery_crawl.demo.pages``), rendered by scrapy-playwright with Debian's chromium
(``pip install "celery-crawl[browser]"``, ``apt-get install chromium``; docs/browsers.md).

Not among the demo app's ``SPIDER_MODULES``, so that the demo runs without the extra:
a project that wants it adds ``"celery_crawl.demo.browser_spiders"``. It is this
module's only spider, so that ``scrapy runspider`` of it runs ``forum_js``; the mixed
site's spider is in :mod:`celery_crawl.demo.mixed_spiders`.

A seed is ``{"forum_id": "00001"}``: its list pages, then each post, each one
rendered (``meta={"playwright": True}``). An item is a post as the browser shows it.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from typing import Any

from scrapy import Request, Spider
from scrapy.http import Response

from celery_crawl.demo.spiders import forum_id_of, set_forum_feed

HANDLER = "celery_crawl.browser.handler.BrowserDownloadHandler"
# scrapy-playwright's own handler: a one-process reference crawl of plain scrapy-playwright,
# ``scrapy runspider browser_spiders.py -s DOWNLOAD_HANDLERS='<this, as JSON>'``
PLAIN_HANDLER = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
PLAIN_HANDLERS = {"http": PLAIN_HANDLER, "https": PLAIN_HANDLER}
# Debian's package: no browser download
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class ForumJsSpider(Spider):
    name = "forum_js"
    seed_key = "forum_id"
    custom_settings = {  # noqa: RUF012 (Scrapy reads it as a class attribute)
        "DOWNLOAD_HANDLERS": {"http": HANDLER, "https": HANDLER},
        "PLAYWRIGHT_BROWSER_TYPE": "chromium",
        "PLAYWRIGHT_LAUNCH_OPTIONS": {"executable_path": CHROMIUM, "headless": True},
        # pages a process renders at once: Scrapy's default, in a worker as in `scrapy crawl`
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
    }

    @classmethod
    def update_settings(cls, settings: Any) -> None:
        super().update_settings(settings)
        set_forum_feed(settings)  # items: JSON lines, per spider and process

    @property
    def base_url(self) -> str:
        return str(self.settings.get("FORUM_BASE_URL")).rstrip("/")

    def requests_from_seed(self, seed: Any) -> list[Request]:
        return [self.rendered(f"{self.base_url}/js/list/{forum_id_of(seed)}/1", self.parse_list)]

    async def start(self) -> AsyncIterator[Request]:
        """``scrapy crawl forum_js -a forums=00001,00002``: the plain, one-process crawl."""
        for forum_id in str(getattr(self, "forums", "")).split(","):
            if forum_id:
                for request in self.requests_from_seed({"forum_id": forum_id}):
                    yield request

    def rendered(self, url: str, callback: Any) -> Request:
        return Request(url, callback=callback, meta={"playwright": True})

    def parse_list(self, response: Response) -> Iterator[Request]:
        for href in response.css("li.post a::attr(href)").getall():
            yield self.rendered(response.urljoin(href), self.parse_post)
        following = response.css("a#next::attr(href)").get()
        if following:
            yield self.rendered(response.urljoin(following), self.parse_list)

    def parse_post(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {
            "post_id": response.url.rstrip("/").rsplit("/", 1)[-1],
            "title": response.css("h1.title::text").get(),
            "author": response.css("span.author::text").get(),
        }
