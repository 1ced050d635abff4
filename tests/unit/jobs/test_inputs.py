"""A job's input is checked where it enters: each bad case is a clear BadInput, and writes nothing.

Every test runs on a database of its own (``db_url``): Celery's broker and the
crawl state both live there, so ``DBSIZE`` counts whatever a refused job wrote.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery

from celery_crawl import crawl, create_app
from celery_crawl.core.errors import BadInput, ConfigError, JobTimeout
from celery_crawl.jobs.inputs import MAX_SEEDS

GOOD_SEED = {"forum_id": "00001"}
HUGE = "1" * 10_000_000  # 10 MB
READABLE = 1_000  # characters: the most a message quoting input may take


@pytest.fixture
def app(db_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Celery:
    monkeypatch.setenv("REDIS_URL", db_url)
    return create_app("inputs", "tasks.settings", settings={"CELERY_CRAWL_KEY_PREFIX": prefix})


@pytest.fixture
def db(db_url: str) -> redis.Redis:
    return redis.Redis.from_url(db_url)


def refused(app: Celery, db: redis.Redis, match: str, *args: Any, **kwargs: Any) -> None:
    """``crawl(*args, **kwargs)`` raises BadInput, quotes input readably, writes nothing."""
    with pytest.raises(BadInput, match=match) as raised:
        crawl(*args, app=app, **kwargs)
    assert len(str(raised.value)) < READABLE
    assert db.dbsize() == 0, db.keys()


@pytest.mark.parametrize(
    "job_id",
    ["~states", "~active", "~ended:x", "a b", "a\nb", "a\x00b", "", "a:participants", "x" * 64, 7],
)
def test_a_job_id_outside_the_safe_alphabet_is_refused(
    app: Celery, db: redis.Redis, job_id: Any
) -> None:
    refused(app, db, "job id .*: 1 to 63 characters of A-Z", "forum", [GOOD_SEED], job_id=job_id)


@pytest.mark.parametrize("priority", [1.5, "high", True, None, 2**40])
def test_a_priority_that_is_not_a_bounded_integer_is_refused(
    app: Celery, db: redis.Redis, priority: Any
) -> None:
    refused(app, db, "priority .*: (an integer|at most)", "forum", [GOOD_SEED], priority)


@pytest.mark.parametrize("seeds", ["00001", b"00001", GOOD_SEED, {"00001"}, 5])
def test_seeds_that_are_not_a_list_are_refused(app: Celery, db: redis.Redis, seeds: Any) -> None:
    refused(app, db, "seeds .*: a list of seeds, not a", "forum", seeds)


@pytest.mark.parametrize(
    ("seeds", "match"),
    [
        ([{"forum_id": HUGE}], "seed 0 .*: 10,000,01\\d bytes as JSON, at most 16,384"),
        ([GOOD_SEED] * (MAX_SEEDS + 1), "10,001 seeds: a job takes at most 10,000"),
        ([{"forum_id": "1" * 16_000}] * 70, "seeds of 1,12\\d,\\d+ bytes as JSON: a job takes"),
        ([GOOD_SEED, float("nan")], "seed 1 nan: not JSON data"),
        ([object()], "seed 0 <object object at .*: not JSON data"),
    ],
)
def test_seeds_too_many_too_big_or_not_json_are_refused(
    app: Celery, db: redis.Redis, seeds: list[Any], match: str
) -> None:
    refused(app, db, match, "forum", seeds)


@pytest.mark.parametrize(
    ("limits", "match"),
    [
        ({"pages": -1}, "pages=-1: a finite number, 0 \\(no limit\\) or more"),
        ({"items": float("nan")}, "items=nan: a finite number"),
        ({"pages": float("inf")}, "pages=inf: a finite number"),
        ({"seconds": -5}, "seconds=-5: a finite number"),
        ({"depth": -1}, "depth=-1: a finite number"),
        ({"pages": 1.5}, "pages=1.5: a whole number"),
        ({"pages": "10"}, "pages='10': a number"),
        ({"errors": True}, "errors=True: a number"),
        ({"items": 2**60}, "items=1152921504606846976: at most 2\\*\\*53"),
        ({"width": 2}, "job limit 'width': the limits are pages, items"),
        (["pages", 1], "limits .*: a dict of limit name"),
    ],
)
def test_limits_not_finite_positive_numbers_are_refused(
    app: Celery, db: redis.Redis, limits: Any, match: str
) -> None:
    refused(app, db, match, "forum", [GOOD_SEED], limits=limits)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"a b": "x"}, "spider argument 'a b'='x': names are identifiers"),
        ({"lang": 1}, "spider argument 'lang'=1: names are identifiers, values str"),
        ({"lang": HUGE}, "spider argument 'lang'='1111.*: at most 16,384 bytes"),
        ("lang=en", "spider arguments 'lang=en': a dict"),
    ],
)
def test_bad_spider_arguments_are_refused(
    app: Celery, db: redis.Redis, args: Any, match: str
) -> None:
    refused(app, db, match, "forum", [GOOD_SEED], args=args)


def test_a_spider_name_that_is_not_a_name_is_refused(app: Celery, db: redis.Redis) -> None:
    refused(app, db, "spider 'fffff.*: a spider's name", "f" * 10_000_000, [GOOD_SEED])
    refused(app, db, "spider None: a spider's name", None, [GOOD_SEED])


def test_a_seed_the_spider_refuses_is_quoted_readably(app: Celery, db: redis.Redis) -> None:
    """Within the size rules, the spider's own refusal of a seed is quoted cut short."""
    refused(app, db, "cannot use seed .*characters\\)", "forum", [{"forum_id": "x" * 16_000}])


def test_the_job_task_checks_its_message_as_crawl_does(app: Celery, db: redis.Redis) -> None:
    """Anyone may send the task: a bad id (the task id) or argument fails it, writing nothing."""
    task = app.tasks["celery_crawl.crawl"]
    sent = [
        ({"args": ("forum", [GOOD_SEED]), "task_id": "~states"}, "job id '~states'"),
        ({"args": ("forum", "00001"), "task_id": "j1"}, "a list of seeds, not a str"),
        ({"args": ("forum", [GOOD_SEED]), "kwargs": {"priority": 1.5}}, "priority 1.5"),
        ({"args": ("forum", [GOOD_SEED]), "kwargs": {"limits": {"pages": -1}}}, "pages=-1"),
    ]
    for options, match in sent:
        with pytest.raises(BadInput, match=match):
            task.apply(**options).get(propagate=True)
    assert db.dbsize() == 0, db.keys()


def test_valid_input_still_starts_jobs(app: Celery, db: redis.Redis) -> None:
    job = crawl(
        "forum",
        ({"forum_id": "00001"}, "00002"),  # a tuple is a list of seeds too
        -3,
        app=app,
        job_id="0f6c2e1a-5d7b-4c1e-9a39-2f1d1c3b4a5e",
        limits={"pages": 10, "seconds": 2.5, "items": 0, "depth": 3.0, "errors": None},
        args={"lang": "en"},
    )
    status = job.status()
    assert status.seeds == [{"forum_id": "00001"}, "00002"]
    assert status.limits == {"pages": 10.0, "seconds": 2.5, "depth": 3.0}
    job.cancel()


def test_a_timeout_message_is_readable_whatever_the_seeds(app: Celery) -> None:
    job = crawl("forum", [{"forum_id": f"{i:05d}"} for i in range(MAX_SEEDS)], app=app)
    with pytest.raises(JobTimeout, match=f"job {job.id} not done after 0.01 s") as raised:
        job.wait(timeout=0.01)
    assert len(str(raised.value)) < 1_200
    job.cancel()


def test_the_producer_leaves_bad_sources_out_and_refuses_bad_settings(
    db_url: str, db: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_crawl.hosting.project import project_of

    monkeypatch.setenv("REDIS_URL", db_url)
    bad = {"PRODUCER_LIMITS": {"pages": float("nan")}}
    for settings in (bad, {"PRODUCER_ARGS": {"a b": "x"}}):
        app = create_app(
            "p", "tasks.settings", settings={"CELERY_CRAWL_KEY_PREFIX": prefix, **settings}
        )
        with pytest.raises(ConfigError, match="PRODUCER_LIMITS or PRODUCER_ARGS: "):
            app.tasks["celery_crawl.produce"].apply(args=("forum",)).get()
    assert db.dbsize() == 0, db.keys()
    app = create_app("p", "tasks.settings", settings={"CELERY_CRAWL_KEY_PREFIX": prefix})
    keys = project_of(app).keys("forum")
    db.sadd(keys.sources, "00001", b"\xff\xfe", "[1,", "1" * 20_000)
    tick = app.tasks["celery_crawl.produce"].apply(args=("forum",)).get()
    assert list(tick["produced"]) == ["00001"]
    assert db.hkeys(keys.producer_running) == [
        b"00001"
    ]  # nothing reserved, then released, for the others
