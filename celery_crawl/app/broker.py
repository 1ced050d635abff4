"""The Celery broker transport of a celery_crawl worker: kombu's Redis transport, one fix over it.

A worker built from a ``create_app`` app whose broker is a ``redis://`` URL uses
:class:`Transport` (``broker_transport``, set by :class:`~celery_crawl.app.worker.CrawlerHosting`).

The fix (kombu 5.7.0, the latest release; Celery 5.7): when the broker connection
drops, Celery's consumer first *collects* the connection, which drops the transport's
reference to its connection settings (``transport.client = None``), then *closes*
it. The close gives the running ``acks_late`` job task's message back
(``restore_unacked``) through a new client, built from the settings that are gone:
``AttributeError: 'NoneType' object has no attribute 'hostname'``. That is no
connection error, so Celery treats it as unrecoverable and the worker's main process
stops taking tasks. The task's own ack, once its job ends, fails the same way.

Here a transport keeps its connection settings for its whole life, so the give-back
is a plain Redis call: with the server still down it fails with a connection error,
which Celery ignores while it reconnects (the message then stays in kombu's unacked
set until the task acks it, or until kombu's visibility timeout gives it back); with
the server back it succeeds, and another worker joins the job again (idempotent).

And one more: a worker whose broker Redis is out of memory when it connects. kombu
declares its queues (``SADD``) and gives back the messages of dead consumers under a
lock (``SET``), writes that a full Redis refuses; kombu counts that refusal as no
connection error, and Celery stops the worker ("Unrecoverable error:
OutOfMemoryError"). Here it is one (:attr:`Transport.connection_errors`): Celery's
consumer logs it and connects again, with its back-off, until Redis has room.

A message taken from a full Redis (``BRPOP`` takes no memory) could not be recorded
as unacknowledged (``ZADD``, ``HSET``): kombu lost it from both. Here
:meth:`QoS.append` keeps it in the process, as kombu's in-memory transports do: the
task runs and is acknowledged; only if the worker dies before that is it lost.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

# the broker URL schemes this transport serves; ``rediss`` keeps kombu's own, whose TLS
# defaults kombu derives from that name (docs/deployment.md)
SCHEMES = ("redis",)
TRANSPORT = "celery_crawl.app.broker:Transport"


logger = logging.getLogger(__name__)


class QoS(kombu_redis.QoS):
    def append(self, message: Any, delivery_tag: Any) -> None:
        """kombu's record of a delivered message; kept in the process if Redis is full."""
        try:
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]
        except redis.exceptions.OutOfMemoryError as exc:
            logger.warning(
                "the broker's Redis is out of memory (%s): a message taken is not recorded as"
                " unacknowledged there; it is lost if this worker dies before it is done",
                exc,
            )
            virtual.QoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]


class Channel(kombu_redis.Channel):
    QoS = QoS

    def _connparams(self, asynchronous: bool = False) -> Any:
        transport = self.connection
        if transport.client is None:  # collected after the connection was lost
            transport.client = transport.settings
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    """kombu's Redis transport whose channels can reach the server after a collect."""

    Channel = Channel
    # a full Redis is waited out like a lost one (the consumer connects again)
    connection_errors = (
        *kombu_redis.Transport.connection_errors,
        redis.exceptions.OutOfMemoryError,
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)  # type: ignore[no-untyped-call]
        self.settings = client  # the kombu Connection: host, port, password, options


def worker_transport(broker_url: Any, configured: Any) -> Any:
    """The ``broker_transport`` a worker should use: this one for a plain Redis URL.

    A transport the application configured is kept.
    """
    if configured or not isinstance(broker_url, str):
        return configured
    scheme = broker_url.split("://", 1)[0].lower()
    return TRANSPORT if scheme in SCHEMES else configured
