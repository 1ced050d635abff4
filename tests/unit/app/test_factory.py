"""The Celery app that create_app builds: what its configuration shows to monitoring."""

from __future__ import annotations

import json

from celery.utils.saferepr import saferepr
from celery.utils.serialization import jsonify

from celery_crawl import create_app
from celery_crawl.hosting.project import project_of
from tests.support.workers import WORKER_SETTINGS

SECRET = "hunter2-never-shown"
URL = f"redis://:{SECRET}@127.0.0.1:6399/3"


def test_inspect_conf_shows_no_password_given_through_create_app() -> None:
    """What ``celery inspect conf`` answers, and Flower shows (celery.worker.control.conf)."""
    overrides = {"REDIS_URL": URL, "REDIS_PARAMS": {"password": SECRET}}
    app = create_app("masked", WORKER_SETTINGS, settings=overrides)
    for with_defaults in (False, True):
        table = app.conf.table(with_defaults=with_defaults)
        answer = json.dumps(jsonify(table, unknown_type_filter=saferepr))
        assert SECRET not in answer
        assert SECRET not in app.conf.humanize(with_defaults=with_defaults, censored=True)
    assert "127.0.0.1:6399" in app.conf.humanize()  # the server is still named
    assert project_of(app).settings["REDIS_URL"] == URL  # and still used
