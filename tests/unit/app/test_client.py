"""What ``crawl()`` sends the broker, on a real server: the job task's message queues
behind beat's ticks and any other task."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from celery_crawl import crawl, create_app
from celery_crawl.app.client import JOB_MESSAGE_PRIORITY, JOB_TASK, PRODUCE_TASK
from celery_crawl.hosting.project import project_of


@pytest.fixture
def app(db_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Celery:
    monkeypatch.setenv("REDIS_URL", db_url)
    return create_app("p", "tasks.settings", settings={"CELERY_CRAWL_KEY_PREFIX": prefix})


def test_a_job_message_is_taken_after_a_tick_sent_later(app: Celery) -> None:
    """kombu's Redis transport keeps a queue's messages in one list per priority step and
    serves 0 first: the job's message (6) waits behind a tick sent after it."""
    job = crawl("forum", [{"forum_id": "00001"}], app=app)
    tick = app.send_task(PRODUCE_TASK, args=("forum",))  # to the spider's queue, too
    name = project_of(app).celery_queues()["forum"]
    broker = redis.Redis.from_url(app.conf.broker_url)
    assert (broker.llen(name), broker.llen(f"{name}\x06\x166")) == (1, 1)  # kombu's lists
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(name, no_ack=True)
        taken = [queue.get(timeout=5) for _ in range(2)]
        queue.close()
    names = [(m.headers["task"], m.headers["id"], m.properties.get("priority")) for m in taken]
    assert names == [(PRODUCE_TASK, tick.id, 0), (JOB_TASK, job.id, JOB_MESSAGE_PRIORITY)]
