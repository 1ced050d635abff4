"""One Redis connection pool per process, shared by every component.

Settings: ``REDIS_URL`` and ``REDIS_PARAMS`` (keyword arguments for the
client), as in scrapy-redis. ``REDIS_URL`` is one of:

- ``redis://``, ``rediss://`` or ``unix://``: one server (``redis.Redis``);
- ``redis+cluster://host:port[,host:port...]``: a Redis Cluster, reached
  through any of the listed nodes (``redis.cluster.RedisCluster``). Every key
  of a spider group carries its hash tag, so each Lua script stays in one slot;
- ``redis+sentinel://host:port[,host:port...]/service[/db]``: the master of
  ``service`` as the sentinels name it (``Sentinel.master_for``). A command
  that fails on a dead master is retried long enough for the sentinels to
  promote a replica, and the retry asks them for the new master; past that,
  the master counts away as one server does (:class:`OutageRetry`);
- ``rediss+cluster://`` and ``rediss+sentinel://``: the same over TLS (to the
  sentinels too). Certificates and checks come from ``REDIS_PARAMS``
  (``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``...).

Transient connection errors are retried with jittered exponential backoff; a
client of one server, or of a Sentinel service, then counts its server away, and
tries each call once until a command goes through (:class:`OutageRetry`). What
still fails surfaces as a connection error, or
:class:`~celery_crawl.core.errors.RedisUnavailable`; a caller that meets it again
and again says so with :func:`warn_away`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import SSLConnection
from redis.exceptions import ClusterDownError, TryAgainError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from celery_crawl.core.defaults import FALLBACK_REDIS_URL, SETTINGS, setting
from celery_crawl.core.errors import ConfigError, RedisUnavailable

logger = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_URL = FALLBACK_REDIS_URL
# what a restart, a failover or a cluster resharding raise after the client's
# own retries: the callers keep their buffers and try again later
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    ClusterDownError,
    TryAgainError,
)
# and with them, what a damaged key makes a script raise (WRONGTYPE, a counter
# that is not a number): the buffers are kept, and the keys repaired (repair.py)
REFUSED_OR_TRANSIENT: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, redis.ResponseError)
# what Redis answers a write (a script's first write) while over its ``maxmemory``
# with the policy ``noeviction``: nothing damaged, so no repair; kept and sent again
OUT_OF_MEMORY = redis.exceptions.OutOfMemoryError
# what a write on the request path waits out (kept, tried again later): Redis away or full
AWAY_OR_FULL: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, OUT_OF_MEMORY)
# the only policy under which Redis never drops a key of the crawl to make room
SAFE_POLICY = "noeviction"
# used within this share of maxmemory counts as out of memory: Redis compares without
# its replication and AOF buffers, and INFO is a moment's reading
MEMORY_MARGIN = 0.01
DEFAULT_PARAMS: dict[str, Any] = dict(SETTINGS["REDIS_PARAMS"].default)
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES, *SENTINEL_SCHEMES)
# a failover takes the sentinels' down-after time plus an election: retry for
# about 20 s (0.1 s doubling to 2 s, 14 times) before a command gives up
FAILOVER_RETRIES = 14

_clients: dict[tuple[int, str, str], redis.Redis] = {}
_lock = threading.Lock()


def _new_lock() -> None:
    """In a forked child: a thread of the parent (a job tracker) may have held it at the fork,
    and the child inherits it held, with no thread to release it."""
    global _lock  # noqa: PLW0603 - rebound in a forked child only
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


@dataclass(frozen=True)
class MultiHostUrl:
    """A ``redis+cluster://`` or ``redis+sentinel://`` URL, taken apart."""

    scheme: str
    hosts: list[tuple[str, int]]
    path: list[str]
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str, default_port: int) -> MultiHostUrl:
        parts = urlsplit(url)
        userinfo, _, hostlist = parts.netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        hosts = [host_port(item, default_port) for item in hostlist.split(",") if item]
        if not hosts:
            raise ConfigError(f"REDIS_URL {redact(url)!r} names no host")
        return cls(
            parts.scheme,
            hosts,
            [unquote(p) for p in parts.path.split("/") if p],
            unquote(user) or None,
            unquote(password) or None,
        )

    @property
    def tls(self) -> bool:
        return self.scheme.startswith("rediss+")

    def auth(self) -> dict[str, Any]:
        pairs = (("username", self.username), ("password", self.password))
        return {name: value for name, value in pairs if value}


def host_port(text: str, default_port: int) -> tuple[str, int]:
    host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    try:
        return host, int(port or default_port)
    except ValueError:
        raise ConfigError(f"bad host:port {text!r} in REDIS_URL") from None


def redact(url: str) -> str:
    """The URL with any password replaced, fit for error messages and logs."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if not password:
        return url
    return urlunsplit(parts._replace(netloc=f"{user}{colon}***{at}{hosts}"))


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def is_sentinel_url(url: str) -> bool:
    return urlsplit(url).scheme in SENTINEL_SCHEMES


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (no scripts in pipelines, no WAIT)."""
    return isinstance(client, RedisCluster)


def url_from_settings(settings: Any) -> str:
    url = setting(settings, "REDIS_URL")
    host = setting(settings, "REDIS_HOST")
    if not url and host:
        url = f"redis://{host}:{setting(settings, 'REDIS_PORT')}/{setting(settings, 'REDIS_DB')}"
    url = str(url or os.environ.get("REDIS_URL") or DEFAULT_URL)
    if urlsplit(url).scheme not in _SCHEMES:
        raise ConfigError(f"REDIS_URL {redact(url)!r} must start with one of {_SCHEMES}")
    return url


def get_redis(url: str = DEFAULT_URL, params: dict[str, Any] | None = None) -> redis.Redis:
    """The process's client for ``url``; created once, then shared.

    A ``RedisCluster`` is typed as ``redis.Redis`` here: it has the same
    commands, and every component takes either.
    """
    merged = {**DEFAULT_PARAMS, **(params or {})}
    merged.pop("redis_cls", None)  # scrapy-redis import-by-name hook: not supported
    cache_key = (os.getpid(), url, repr(sorted(merged.items())))
    with _lock:
        client = _clients.get(cache_key)
        if client is None:
            client = cast(redis.Redis, make_client(url, merged))
            _clients[cache_key] = client
    return client


def make_client(url: str, params: dict[str, Any]) -> redis.Redis | RedisCluster:
    """A new client of the kind ``url`` names (see the module docstring)."""
    if is_cluster_url(url):
        return cluster_client(MultiHostUrl.parse(url, 6379), params)
    if is_sentinel_url(url):
        return sentinel_client(MultiHostUrl.parse(url, 26379), params)
    retry = OutageRetry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), retries=5)
    return redis.Redis.from_url(url, retry=retry, **params)


AWAY_WARN_SECONDS = 30.0  # a repeated "Redis unreachable" warning, at most this often


class _AwayWarnings:
    """When each repeated warning was last said, and how many went to DEBUG since."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.said: dict[tuple[str, str], tuple[float, int]] = {}


_away_warnings = _AwayWarnings()


def _new_away_warnings() -> None:
    """In a forked child, as :func:`_new_lock`: a parent's thread may have held the lock at
    the fork; and the child says its own warnings."""
    global _away_warnings  # noqa: PLW0603 - rebound in a forked child only
    _away_warnings = _AwayWarnings()


os.register_at_fork(after_in_child=_new_away_warnings)


def warn_away(log: logging.Logger | logging.LoggerAdapter[Any], message: str, *args: Any) -> None:
    """A warning that Redis is away, from a call made again and again (each lease, flush or
    beat): said at most once per :data:`AWAY_WARN_SECONDS` for each logger and message,
    the ones between at DEBUG; the next warning counts them. An outage is said, and a
    worker hosting dozens of spiders does not fill its log while it lasts."""
    warnings = _away_warnings
    key, now = (log.name, message), time.monotonic()
    with warnings.lock:
        last, quiet = warnings.said.get(key, (float("-inf"), 0))
        due = now - last >= AWAY_WARN_SECONDS
        warnings.said[key] = (now, 0) if due else (last, quiet + 1)
    if not due:
        log.debug(message, *args, stacklevel=2)
    elif quiet:
        since = f" ({quiet} more like it since the last, {now - last:.0f} s ago)"
        log.warning(message + since, *args, stacklevel=2)
    else:
        log.warning(message, *args, stacklevel=2)


class _Outage:
    """Since when a client's server has been away (None: it answers); shared by the
    copies of an :class:`OutageRetry`, which every connection of the client makes."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.lock = threading.Lock()

    def went_away(self) -> bool:
        """Mark the server away; True if it was not already."""
        with self.lock:
            if self.since is not None:
                return False
            self.since = time.monotonic()
            return True

    def came_back(self) -> float | None:
        """Mark the server answering; the seconds it was away, None if it was not."""
        with self.lock:
            since, self.since = self.since, None
        return None if since is None else time.monotonic() - since


class OutageRetry(Retry):
    """redis-py's retry with back-off, until a call has spent every retry: the server
    counts as away, and each call then tries once, without back-off, until a command
    goes through.

    A process makes many calls of its own accord: every hosted spider's heartbeat,
    maintenance, stats flush, leases. With each one spending its retries (about 1.5 s
    of back-off on average for one server, about 20 s for a Sentinel service, whose
    retries ride out a failover) one after another, a Redis outage kept a worker's
    reactor asleep, and a worker hosting 22 spiders took a minute to stop. Every caller
    handles a connection error already (kept, and tried again later); now it gets it
    at once while the server is known to be away.

    Only a command's answer ends an outage: in redis-py 8 a command, a pipeline, a
    pub/sub call and a health check are the calls made ``with_failure_count``, and the
    outermost such call on a thread is the command itself. A connection's handshake
    is a call of its own, outside the command, and a reconnect is one inside it: a
    server that accepts connections while it loads its data (``LOADING``) is still away.
    """

    def __init__(
        self,
        backoff: Any,
        retries: int,
        outage: _Outage | None = None,
        supported_errors: tuple[type[Exception], ...] | None = None,
    ) -> None:
        if supported_errors is None:
            super().__init__(backoff, retries)
        else:
            super().__init__(backoff, retries, supported_errors)
        self.outage = outage or _Outage()
        self._depth = threading.local()  # calls of this retry under way on a thread

    def __deepcopy__(self, memo: dict[int, Any]) -> OutageRetry:
        """A copy for a connection: its own back-off, the client's outage."""
        backoff = copy.deepcopy(self._backoff, memo)
        return OutageRetry(backoff, self._retries, self.outage, self._supported_errors)

    @property
    def away(self) -> bool:
        return self.outage.since is not None

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        try:
            result = self._call(do, fail, is_retryable, with_failure_count)
        finally:
            self._depth.n = depth
        if with_failure_count and depth == 0 and self.away:  # a command went through
            self._came_back()
        return result

    def _call(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None,
        with_failure_count: bool,
    ) -> T:
        if not self.away:
            try:
                return super().call_with_retry(do, fail, is_retryable, with_failure_count)
            except self._supported_errors as error:
                if is_retryable is None or is_retryable(error):
                    self._went_away(error)
                raise
        try:  # away: one try
            return do()
        except self._supported_errors as error:
            if is_retryable is not None and not is_retryable(error):
                raise
            if with_failure_count:
                fail(error, 1)
            else:
                fail(error)
            raise

    def _went_away(self, error: Exception) -> None:
        if self.outage.went_away():
            warn_away(
                logger,
                "Redis unreachable after %d retries (%s): calls try once until one goes through",
                self._retries,
                error,
            )

    def _came_back(self) -> None:
        away = self.outage.came_back()
        if away is not None:
            warn_away(logger, "Redis answers again, after %.1f s away", away)


def cluster_client(url: MultiHostUrl, params: dict[str, Any]) -> RedisCluster:
    if url.path not in ([], ["0"]):
        raise ConfigError("a Redis Cluster has only database 0: drop the path of REDIS_URL")
    params = {k: v for k, v in params.items() if k != "health_check_interval"}
    retry = Retry(ExponentialWithJitterBackoff(base=0.05, cap=2.0), retries=5)
    nodes = [ClusterNode(host, port) for host, port in url.hosts]  # type: ignore[no-untyped-call]
    kwargs = {**params, **url.auth(), "retry": retry, **({"ssl": True} if url.tls else {})}
    return RedisCluster(startup_nodes=nodes, **kwargs)


class MasterFollowingConnection(SentinelManagedConnection):
    """Asks the sentinels for the master on every connect, reconnects included.

    redis-py 8 reconnects a broken connection (a retried command, a blocked
    BLPOP) through ``connect_check_health``, to the address it had before: the
    dead master's, until the retries run out.
    """

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if not self._sock and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health, retry_socket_connect)


class MasterFollowingSSLConnection(MasterFollowingConnection, SSLConnection):
    """:class:`MasterFollowingConnection` over TLS (``rediss+sentinel://``)."""


def sentinel_client(url: MultiHostUrl, params: dict[str, Any]) -> redis.Redis:
    service, db = sentinel_service(url)
    shared = ("socket_", "ssl_") if url.tls else ("socket_",)  # the sentinels' own connections
    to_sentinels = {k: v for k, v in params.items() if k.startswith(shared)}
    if url.tls:
        to_sentinels["ssl"] = True
    # no retries of its own for a sentinel's question: the next sentinel is its retry, and
    # the command's retry asks them all again (with redis-py's default, each sentinel down
    # cost every try about 4 s)
    to_sentinels["retry"] = Retry(NoBackoff(), 0)
    sentinels = Sentinel(url.hosts, sentinel_kwargs=to_sentinels)  # type: ignore[no-untyped-call]
    # a failover's worth of retries; past them the master counts away, as one server does
    retry = OutageRetry(ExponentialWithJitterBackoff(base=0.1, cap=2.0), FAILOVER_RETRIES)
    kwargs = {**params, **url.auth(), "db": db, "retry": retry}
    kwargs["connection_class"] = (
        MasterFollowingSSLConnection if url.tls else MasterFollowingConnection
    )
    master = sentinels.master_for(service, **kwargs)  # type: ignore[no-untyped-call]
    return cast(redis.Redis, master)


def sentinel_service(url: MultiHostUrl) -> tuple[str, int]:
    """The service name and database of a ``redis+sentinel://`` URL."""
    if not url.path or len(url.path) > 2 or not (url.path[1:] or ["0"])[0].isdigit():
        raise ConfigError(
            "REDIS_URL must read redis+sentinel://host:port[,host:port...]/service[/db]"
        )
    return url.path[0], int(url.path[1]) if len(url.path) > 1 else 0


def from_settings(settings: Any) -> redis.Redis:
    params = setting(settings, "REDIS_PARAMS")
    return get_redis(url_from_settings(settings), params)


@contextlib.contextmanager
def reachable(client: redis.Redis) -> Iterator[None]:
    """Turn "cannot connect", after the retries, into a clear error naming the server."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailable(
            f"cannot reach Redis at {describe(client)}: {exc}. Start a Redis server there, point"
            " REDIS_URL at yours (REDIS_URL=redis://host:6379/0), or try `celery-crawl demo`,"
            " which starts one of its own"
        ) from exc


def check(client: redis.Redis) -> None:
    """Ping Redis once; raise a clear error naming the server if it cannot be reached."""
    with reachable(client):
        client.ping()


def describe(client: redis.Redis | RedisCluster) -> str:
    if isinstance(client, RedisCluster):
        nodes = client.nodes_manager.startup_nodes.values()
        return "cluster " + ",".join(f"{n.host}:{n.port}" for n in nodes)
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        return f"sentinel service {pool.service_name!r}"
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


@dataclass(frozen=True)
class Memory:
    """What ``INFO memory`` and ``INFO stats`` say of the server's memory (the fullest node
    of a cluster). ``maxmemory`` 0: no limit."""

    used: int
    maxmemory: int
    policy: str
    evicted_keys: int

    @property
    def out_of_memory(self) -> bool:
        """Whether Redis refuses writes for memory now (or is within ``MEMORY_MARGIN`` of it)."""
        limit = self.maxmemory
        refuses = self.policy == SAFE_POLICY or self.policy.startswith("volatile-")
        return limit > 0 and refuses and self.used >= limit * (1 - MEMORY_MARGIN)

    def describe(self) -> str:
        mib = 1024 * 1024
        return (
            f"Redis is out of memory: {self.used / mib:.1f} MiB used of maxmemory"
            f" {self.maxmemory / mib:.1f} MiB (policy {self.policy}); it refuses writes, so"
            " workers keep the requests they hold and lease no more until it has room"
            " (free memory, or raise maxmemory)"
        )


def memory(client: redis.Redis) -> Memory | None:
    """The server's memory use and evictions: one ``INFO`` round trip (two commands; on a
    cluster, two, to every node: no INFO in a cluster pipeline); None where ``INFO`` is
    refused (an ACL)."""
    try:
        if is_cluster(client):
            mem, stats = client.info("memory"), client.info("stats")
        else:
            with client.pipeline(transaction=False) as pipe:
                pipe.info("memory")
                pipe.info("stats")
                mem, stats = pipe.execute()
    except redis.ResponseError:
        return None
    readings = [
        Memory(
            int(m.get("used_memory", 0)),
            int(m.get("maxmemory", 0)),
            str(m.get("maxmemory_policy", SAFE_POLICY)),
            int(s.get("evicted_keys", 0)),
        )
        for m, s in zip(_per_node(mem), _per_node(stats), strict=True)
    ]
    fullest = max(readings, key=lambda r: r.used / r.maxmemory if r.maxmemory else 0.0)
    return Memory(
        fullest.used, fullest.maxmemory, fullest.policy, sum(r.evicted_keys for r in readings)
    )


def _per_node(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """A server's INFO section, or each node's (a cluster client answers per node)."""
    if reply and all(isinstance(v, dict) for v in reply.values()):
        return [reply[node] for node in sorted(reply)]
    return [reply]


def check_eviction(client: redis.Redis, allow: bool) -> str | None:
    """Refuse a server whose ``maxmemory-policy`` evicts keys, unless ``allow``; the policy.

    An evicting policy drops keys of the crawl when memory runs short: a job's
    hash, a level list of queued requests, dedup keys. ``CONFIG GET`` may be
    refused (an ACL, a managed service): then a warning, and the crawl goes on.
    """
    try:
        reply: Any = client.config_get("maxmemory-policy")
    except redis.ResponseError as exc:
        logger.warning(
            "maxmemory-policy not checked (%s): if it is not noeviction, Redis may drop crawl"
            " keys (jobs, queued requests) when memory runs short",
            exc,
        )
        return None
    values = _per_node(reply) if isinstance(reply, dict) else [{}]
    policies = {str(v.get("maxmemory-policy", SAFE_POLICY)) for v in values}
    policy = next((p for p in sorted(policies) if p != SAFE_POLICY), SAFE_POLICY)
    if policy == SAFE_POLICY:
        return policy
    text = (
        f"Redis at {describe(client)} has maxmemory-policy {policy}: when memory runs short it"
        " evicts keys of the crawl (a job's hash, queued requests, dedup keys), which are lost"
        " for good. Set maxmemory-policy noeviction (Redis then refuses writes and the crawl"
        " waits for room), or set CELERY_CRAWL_ALLOW_EVICTION to accept the loss"
    )
    if not allow:
        raise ConfigError(text)
    logger.warning("%s (CELERY_CRAWL_ALLOW_EVICTION is set: going on)", text)
    return policy
