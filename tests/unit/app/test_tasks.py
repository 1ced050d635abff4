"""The job task's start, on a real server: it starts a job sent without ``crawl()``, and
only finds one that ``crawl()`` started."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery

from celery_crawl import create_app
from celery_crawl.app.client import start_job
from celery_crawl.app.tasks import start_when_room
from celery_crawl.core.errors import BadInput
from celery_crawl.hosting.project import Project, project_of
from celery_crawl.jobs.handle import Job
from celery_crawl.jobs.inputs import check_job

SEEDS = [{"forum_id": "00001"}, {"forum_id": "00002"}]


@pytest.fixture
def app(db_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Celery:
    monkeypatch.setenv("REDIS_URL", db_url)
    return create_app("p", "tasks.settings", settings={"CELERY_CRAWL_KEY_PREFIX": prefix})


def start(app: Celery, job_id: str) -> tuple[Job, bool]:
    """What the job task does first, given the message's arguments."""
    given = check_job("forum", SEEDS, priority=0, job_id=job_id, limits={}, args={})
    return start_when_room(app.tasks["celery_crawl.crawl"], project_of(app), given)


def test_a_task_sent_without_crawl_starts_its_job(app: Celery) -> None:
    job, created = start(app, "sent-alone")
    assert created and job.status().state == "running"
    assert len(project_of(app).queue("forum")) == len(SEEDS)


def test_a_job_that_crawl_started_is_found_and_its_seeds_are_not_made_again(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = project_of(app)
    started, created = start_job(project, "forum", SEEDS, 0, "by-crawl")
    assert created
    queue = project.queue("forum")
    queue.client.delete(*queue.client.keys(f"{queue.keys.queue}*"))  # its seeds taken

    def made_again(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the task made the started job's seeds again")

    monkeypatch.setattr(Project, "seed_entries", made_again)
    job, created = start(app, "by-crawl")
    assert not created and job.id == started.id and job.exists()
    assert len(queue) == 0  # nothing pushed again


def test_a_job_records_its_source_and_a_bad_one_is_refused(app: Celery) -> None:
    given = check_job(
        "forum", SEEDS, priority=0, job_id="of-a-source", limits={}, args={}, source="busy-1"
    )
    job, created = start_when_room(app.tasks["celery_crawl.crawl"], project_of(app), given)
    assert created and job.status().source == "busy-1"
    with pytest.raises(BadInput, match="source"):
        check_job("forum", SEEDS, priority=0, job_id="x", limits={}, args={}, source="a:b")


def test_a_producer_source_names_its_jobs_source() -> None:
    from celery_crawl.app.tasks import source_id

    assert source_id("00001") == "00001"  # a forum id is a source id as it is
    url = source_id("https://news.example/front?page=1")  # a URL is not: its digest
    assert url.startswith("src-") and url == source_id("https://news.example/front?page=1")
    assert check_job("forum", SEEDS, priority=0, job_id="x", limits={}, args={}, source=url)


def test_a_redis_error_at_a_progress_report_keeps_the_job_watched(
    db_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart can cut the report at a progress interval (the result backend's write, the
    job's status): the task warns and watches on, and returns the job's end; it used to fail
    outside its body, its result never stored."""
    from celery_crawl.app import tasks

    monkeypatch.setenv("REDIS_URL", db_url)
    settings = {"CELERY_CRAWL_KEY_PREFIX": prefix, "CELERY_CRAWL_PROGRESS_INTERVAL": 0.1}
    app = create_app("p", "tasks.settings", settings=settings)
    app.conf.task_always_eager = True
    reports: list[str] = []

    def cut_then_ended(task: Any, status: Any, *args: Any) -> str:
        reports.append(status.state)
        if len(reports) == 1:
            raise redis.ConnectionError("Connection reset by peer")  # the restart
        project = project_of(app)
        Job(status.job_id, "forum", project.client, project.keys("forum")).close("enough")
        return ""

    monkeypatch.setattr(tasks, "report_progress", cut_then_ended)
    outcome = app.tasks["celery_crawl.crawl"].apply(args=("forum", SEEDS), task_id="cut-report")
    assert outcome.successful(), outcome.traceback
    assert outcome.result["state"] == "closed" and outcome.result["reason"] == "enough"
    assert reports == ["running", "running"]  # watched on after the cut


def test_the_index_entry_written_as_redis_goes_away_does_not_fail_the_ended_job(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """The job ended; Redis restarts just as the task renews the job's index entry: the
    renewal warns instead of raising (it used to raise, and the task failed with it)."""
    from celery_crawl.app.tasks import write_index
    from tests.support.ports import free_port

    project = project_of(app)
    gone = redis.Redis(port=free_port(), socket_connect_timeout=1)  # nobody listens
    job = Job("ended", "forum", gone, project.keys("forum"))
    write_index(job, "an-index-key", 60)
    assert "its index entry not renewed, Redis unreachable" in caplog.text
