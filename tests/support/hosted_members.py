"""Hosted spiders with a login, for the per-job cookie tests.

A seed ``{"site": URL, "pages": N, "tag": T, "login": bool, "user": NAME}``
either logs in as ``user`` (``POST /login``; default ``crawler``) and then
yields the members-only pages 1..N, or yields them without logging in. Every
member page becomes an item ``{"tag", "n", "status", "user"}`` (``user``: whose
page the site served, None for a 403), in a feed file per worker process, and
a log line ``member page N of tag T: STATUS``.

``hosted_members`` keeps its jars in Redis (``COOKIES_SHARED``);
``hosted_members_local`` keeps them in each process, as Scrapy does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from scrapy import FormRequest, Request, Spider
from scrapy.http import Response


class HostedMembersSpider(Spider):
    name = "hosted_members"
    custom_settings: ClassVar[dict[str, Any]] = {"COOKIES_SHARED": True}
    handle_httpstatus_list: ClassVar[list[int]] = [403]  # a member page refused is an item too

    @classmethod
    def update_settings(cls, settings: Any) -> None:
        super().update_settings(settings)
        feed = settings.get("FORUM_FEED")  # the test workers' feed template, one file per pid
        if feed:
            settings.set("FEEDS", {feed: {"format": "jsonlines"}}, priority="spider")

    def requests_from_seed(self, seed: dict[str, Any]) -> list[Request]:
        site, tag = seed["site"], seed["tag"]
        if seed["login"]:
            form = {"user": seed.get("user", "crawler"), "password": "secret"}
            kwargs = {"site": site, "pages": seed["pages"], "tag": tag}
            return [
                FormRequest(
                    f"{site}/login", formdata=form, callback=self.logged_in, cb_kwargs=kwargs
                )
            ]
        return list(self.member_pages(site, seed["pages"], tag))

    def logged_in(self, response: Response, site: str, pages: int, tag: str) -> Iterator[Request]:
        yield from self.member_pages(site, pages, tag)

    def member_pages(self, site: str, pages: int, tag: str) -> Iterator[Request]:
        for n in range(1, pages + 1):
            url = f"{site}/members/{n}.html?tag={tag}"  # dedup is spider-wide: a URL per tag
            yield Request(url, callback=self.parse_member, cb_kwargs={"tag": tag, "n": n})

    def parse_member(self, response: Response, tag: str, n: int) -> Iterator[dict[str, Any]]:
        user = response.css("h1::attr(data-user)").get()
        self.logger.info("member page %d of tag %s: %d", n, tag, response.status)
        yield {"tag": tag, "n": n, "status": response.status, "user": user}


class HostedMembersLocalSpider(HostedMembersSpider):
    name = "hosted_members_local"
    custom_settings: ClassVar[dict[str, Any]] = {}  # Scrapy's jars, in each process
