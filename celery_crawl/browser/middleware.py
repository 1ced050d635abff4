"""Render only where needed: a plain response that lacks what its callback needs is
fetched again through the browser (scrapy-playwright), the others are kept as they are.

Enable it in ``DOWNLOADER_MIDDLEWARES`` (``celery_crawl.browser.middleware.RenderWhenNeeded``,
at 590) and say what a callback needs, in either way:

- ``BROWSER_RENDER_IF_MISSING``: callback name -> CSS selector, e.g.
  ``{"parse_post": "h1.title"}``: a plain 200 response for ``parse_post`` in which
  ``h1.title`` matches nothing is rendered;
- or a spider method ``needs_browser(response) -> bool``, which then decides for every
  plain response.

A rendered request goes back to the scheduler as a new request of the same job
(``dont_filter``: the plain fetch of the same URL is not a duplicate of it). Counts, in
the crawl's stats and in the job's (``browser`` of ``Job.wait()``'s dict):
``browser/render_needed`` and ``browser/plain_enough``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import NotConfigured
from scrapy.http import TextResponse

from celery_crawl.core.defaults import setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.jobs.signals import job_stat

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector


class RenderWhenNeeded:
    """A downloader middleware: plain responses that lack what their callback needs are
    rendered; ``rules`` maps callback names to the CSS selector each needs."""

    def __init__(
        self,
        rules: Mapping[str, str],
        stats: StatsCollector,
        crawler: Crawler | None = None,
    ) -> None:
        self.rules = dict(rules)
        self.stats = stats
        # its spider's needs_browser, and the job's stats through job_stat; None: neither
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RenderWhenNeeded:
        rules = setting(crawler.settings, "BROWSER_RENDER_IF_MISSING")
        if not isinstance(rules, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in rules.items()
        ):
            raise ConfigError(
                f"BROWSER_RENDER_IF_MISSING {rules!r}: a mapping of callback names to CSS selectors"
            )
        spidercls = crawler.spidercls
        if not rules and not callable(getattr(spidercls, "needs_browser", None)):
            raise NotConfigured("no BROWSER_RENDER_IF_MISSING and no needs_browser()")
        assert crawler.stats is not None
        return cls(rules, crawler.stats, crawler)

    def process_response(self, request: Request, response: Response) -> Any:
        if request.meta.get("playwright") or response.status != 200:
            return response
        if not isinstance(response, TextResponse):
            return response
        needs = self._rule(request, getattr(self.crawler, "spider", None))
        if needs is None or not needs(response):
            if needs is not None:
                self._count(request, "browser/plain_enough")
            return response
        self._count(request, "browser/render_needed")
        return request.replace(meta={**request.meta, "playwright": True}, dont_filter=True)

    def _count(self, request: Request, field: str) -> None:
        self.stats.inc_value(field)
        if self.crawler is not None:
            self.crawler.signals.send_catch_log(job_stat, request=request, field=field)

    def _rule(
        self, request: Request, spider: Spider | None
    ) -> Callable[[TextResponse], bool] | None:
        """How to tell that ``request``'s response lacks what its callback needs; None: no rule."""
        method = getattr(spider, "needs_browser", None)
        if callable(method):
            return lambda response: bool(method(response))
        callback = request.callback
        name = getattr(callback, "__name__", "parse" if callback is None else "")
        selector = self.rules.get(name)
        if selector is None:
            return None
        return lambda response: not response.css(selector)
