"""A job's limits: Scrapy's CLOSESPIDER_* and DEPTH_LIMIT by default, the caller's over them."""

from __future__ import annotations

import pytest

from celery_crawl.hosting.project import Project
from celery_crawl.jobs.handle import parse_status
from celery_crawl.jobs.limits import LIMITS, Limit, describe, from_settings, limit_fields


def project(**settings: object) -> Project:
    return Project.from_module("tests.support.worker_settings", dict(settings))


def test_the_spiders_closespider_settings_are_the_default_limits() -> None:
    limited = project(CLOSESPIDER_ITEMCOUNT=5, CLOSESPIDER_TIMEOUT=60)
    assert limited.job_limits("paths", None) == {"items": 5.0, "seconds": 60.0}
    assert limited.job_limits("paths", {"pages": 10}) == {
        "items": 5.0,
        "seconds": 60.0,
        "pages": 10,
    }
    assert limited.job_limits("paths", {"items": 0}) == {"seconds": 60.0}  # 0: no limit
    assert project().job_limits("paths", None) == {}


def test_limits_go_into_the_job_hash_and_come_back() -> None:
    fields = limit_fields({"pages": 3, "seconds": 2.5})
    assert fields == {"limit/pages": "3", "limit/seconds": "2.5"}
    raw = {k.encode(): v.encode() for k, v in {**fields, "state": "running"}.items()}
    assert parse_status("j", "paths", raw, 0.0).limits == {"pages": 3.0, "seconds": 2.5}
    with pytest.raises(ValueError, match="unknown job limits \\['width'\\]"):
        limit_fields({"width": 2})


def test_depth_and_errors_take_depth_limit_and_closespider_errorcount() -> None:
    limited = project(DEPTH_LIMIT=3, CLOSESPIDER_ERRORCOUNT=2)
    assert limited.job_limits("paths", None) == {"depth": 3.0, "errors": 2.0}
    assert limited.job_limits("paths", {"depth": 0}) == {"errors": 2.0}  # 0: no limit
    assert limit_fields({"depth": 1, "errors": 4}) == {"limit/depth": "1", "limit/errors": "4"}


def test_the_help_text_names_every_limit_with_its_setting() -> None:
    text = describe()
    for name, limit in LIMITS.items():
        assert f"{name} ({limit.counts}, {limit.setting})" in text
    assert "Reaching pages, items, seconds or errors ends the job closed" in text
    assert "reason (closespider_pagecount, closespider_itemcount, closespider_timeout," in text
    assert text.endswith("beyond depth, requests are not followed")


def test_the_producers_limits_setting_names_every_limit() -> None:
    """The settings registry sits below this package and lists the names itself: a new
    limit is added to its meaning too, or this fails."""
    from celery_crawl.core.defaults import SETTINGS

    assert f"as crawl(limits=...) takes them: {', '.join(LIMITS)} (" in (
        SETTINGS["PRODUCER_LIMITS"].meaning
    )


def test_a_limit_whose_setting_is_ours_takes_its_registered_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A limit Scrapy has no setting for reads one of ours, with the registry's default."""
    from scrapy.settings import Settings

    from celery_crawl.core.defaults import SETTINGS
    from celery_crawl.jobs import limits

    ours = Limit("SCHEDULER_LEASE_SECONDS", "", "a stand-in")
    monkeypatch.setattr(limits, "LIMITS", {**LIMITS, "stand_in": ours})
    found = from_settings(Settings({"CLOSESPIDER_PAGECOUNT": 5}))
    assert found["stand_in"] == float(SETTINGS["SCHEDULER_LEASE_SECONDS"].default)
    assert found["pages"] == 5.0
    assert from_settings(Settings({"SCHEDULER_LEASE_SECONDS": 7}))["stand_in"] == 7.0
