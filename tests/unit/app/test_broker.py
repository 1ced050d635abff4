"""The workers' broker transport (celery_crawl.app.broker) on a real server that is full."""

from __future__ import annotations

from pathlib import Path

import kombu
import redis

from celery_crawl.app import broker
from tests.support.full_redis import fill_to_refusal
from tests.support.ports import started_valkey


def test_a_message_taken_from_a_full_broker_is_kept_in_the_process(tmp_path: Path) -> None:
    """Taking a message takes no memory; recording it as unacknowledged does, and kombu
    lost it from both places when Redis refused that (the message was in neither)."""
    server = started_valkey(tmp_path / "valkey")
    url = f"redis://127.0.0.1:{server.port}/0"
    queue = kombu.Queue("jobs", kombu.Exchange("jobs"), "jobs")
    try:
        with kombu.Connection(url, transport=broker.TRANSPORT) as connection:
            producer = connection.Producer()
            producer.publish({"n": 1}, exchange=queue.exchange, routing_key="jobs", declare=[queue])
            client = redis.Redis(port=server.port)
            fill_to_refusal(client, room=1_000_000)
            message = queue(connection.default_channel).get(no_ack=False)
            assert message is not None and message.payload == {"n": 1}
            assert not client.hexists("unacked", message.delivery_tag)  # kept in the process
            message.ack()
            assert client.llen("jobs") == 0  # taken once, acknowledged
    finally:
        server.stop()
