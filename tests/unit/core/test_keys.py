"""Key names that several scripts and modules derive from: computed once, in ``core.keys``."""

from __future__ import annotations

from celery_crawl.core.keys import SpiderKeys


def test_a_groups_sites_are_under_its_hash_tag_and_shared_by_its_spiders() -> None:
    group = SpiderKeys.build("news", prefix="p")
    member = SpiderKeys.build("news_detail", group="news", prefix="p")
    assert group.site_prefix == member.site_prefix == "p:{news}:site:"
    assert member.site("example.com") == "p:{news}:site:example.com"
    assert member.site_leases("example.com") == "p:{news}:site:example.com:leases"


def test_the_site_prefix_does_not_depend_on_the_job_key_template() -> None:
    keys = SpiderKeys.build("news", prefix="p", job="%(prefix)s:jobs:%(spider)s/")
    assert keys.job_prefix == "p:jobs:{news}/"
    assert keys.site_prefix == "p:{news}:site:"  # was cut from the job prefix before
