"""A spider for a mixed site: most pages whole without a browser, some built by a script,
rendered only where needed (``RenderWhenNeeded``; docs/browsers.md). It needs the
``browser`` extra, as :mod:`celery_crawl.demo.browser_spiders` does, and is in no
demo ``SPIDER_MODULES`` either."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from scrapy import Request
from scrapy.http import Response

from celery_crawl.demo.browser_spiders import ForumJsSpider
from celery_crawl.demo.spiders import forum_id_of


class ForumMixedSpider(ForumJsSpider):
    """A mixed site: the forum API's list pages, and posts of which half are served
    whole (``/html/post/<id>``) and half built by a script (``/js/post/<id>``). Nothing
    asks for the browser: ``RenderWhenNeeded`` renders the posts whose plain response has
    no ``h1.title`` (docs/browsers.md)."""

    name = "forum_mixed"
    custom_settings = {  # noqa: RUF012 (Scrapy reads it as a class attribute)
        **ForumJsSpider.custom_settings,
        "DOWNLOADER_MIDDLEWARES": {"celery_crawl.browser.middleware.RenderWhenNeeded": 590},
        "BROWSER_RENDER_IF_MISSING": {"parse_post": "h1.title"},
    }

    def requests_from_seed(self, seed: Any) -> list[Request]:
        url = f"{self.base_url}/list/{forum_id_of(seed)}/1"
        return [Request(url, callback=self.parse_api_list)]

    def parse_api_list(self, response: Response) -> Iterator[Request]:
        listing = json.loads(response.text)
        for post in listing["posts"]:
            kind = "html" if int(post["post_id"]) % 2 == 0 else "js"
            yield Request(f"{self.base_url}/{kind}/post/{post['post_id']}", self.parse_post)
        if listing.get("next_page"):
            following = f"{self.base_url}/list/{listing['forum_id']}/{listing['next_page']}"
            yield Request(following, callback=self.parse_api_list)
