"""A fast demo forum that serves the forum API (``forum-api.md``) from generated data.

Nothing is stored: every page is a pure function of :class:`SiteConfig` and the
ids in the URL, so any number of servers with one config serve the same forum.

Data model:

- Forum ``i`` (1-based) has the id ``f"{i:05d}"`` and ``posts_per_forum`` posts,
  listed oldest first, ``posts_per_page`` to a list page.
- Post ``j`` (0-based) of forum ``i`` has the id ``str(100000 * i + j)``, unique
  across forums. Its ordinal ``j + 1`` decides its fate: every
  ``deleted_every``-th post is deleted (still listed, but ``/post`` and
  ``/comment`` answer 404); every ``hot_every``-th post that is not deleted is
  hot, with ``hot_comment_pages`` full comment pages; any other post has 0 to 45
  comments, from a CRC32 of the seed and its id, so some have no comment page.
- Comment ``n`` (0-based) of a post has the id ``f"{post_id}-{n}"``; its
  ``parent_id`` is null or the id of an earlier comment of the same post.

Forums that grow (``growth``: new posts per minute, cycled over the forums) list
more posts as time passes: from ``growth_from`` on, forum ``i`` gains a post every
``60 / rate`` seconds (:meth:`SiteConfig.appeared_at` says when each appeared; its
``published_at`` says so too), so busy and quiet forums run side by side. Their
pages are functions of the config, the ids and the time.

Script-built pages (``celery_crawl.demo.pages``): ``/js/list/...`` and ``/js/post/...``
serve the data of ``/list/...`` and ``/post/...`` as HTML that only a browser shows.

A rolling listing (``listed``: K above 0) lists only each forum's newest K posts,
oldest first, as a busy board or a news front page does: older posts are still
served at ``/post/<id>``, but no list page links to them any more.

Faults, drawn from one RNG seeded with ``seed`` (so a retry of a URL may
succeed): a request is answered 503 with probability ``error_rate``; a 200
body is cut in half, which is never valid JSON, with probability
``malformed_rate``. ``latency`` seconds pass before each response.

Politeness, for crawlers measured at the site: with ``rate_limit`` above 0, a
request that finds ``rate_limit`` or more requests accepted (answered other
than 429) in the last second is answered 429 with ``Retry-After:
<retry_after>``, or with ``rate_limit_status`` 503, 503 with no header (an
overloaded server that says nothing more); :meth:`DemoSite.answer_429` makes
the next requests 429 on demand. Every request served is logged as an :class:`Arrival` (path, start,
end, status), and the site keeps the highest number of requests it served at
once (:attr:`ArrivalLog.max_in_flight`).

:meth:`SiteConfig.expected` gives the totals a complete crawl must reach.
``python -m celery_crawl.demo.site --port 8000`` (or ``celery-crawl site``) serves a forum
until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sys
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from types import TracebackType
from typing import Any

import typer

from celery_crawl.demo import pages

POST_ID_STRIDE = 100_000
MAX_PLAIN_COMMENTS = 45
EPOCH = datetime(2026, 11, 1, tzinfo=UTC)
IDLE_TIMEOUT = 60.0  # seconds a keep-alive connection may sit idle
MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024
MAX_ARRIVALS = 200_000  # the arrival log keeps the latest this many requests
HOLD_POLL = 0.01  # seconds between looks of a held response at its gate
RATE_WINDOW = 1.0  # seconds over which ``rate_limit`` counts accepted requests

Json = dict[str, Any]
JSON_TYPE = "application/json; charset=utf-8"

NOT_FOUND_BODY = b'{"error": "not found"}'
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    429: "Too Many Requests",
    503: "Service Unavailable",
}
ERROR_BODIES = {
    400: b'{"error": "bad request"}',
    405: b'{"error": "method not allowed"}',
    429: b'{"error": "rate limited"}',
    503: b'{"error": "service unavailable"}',
}


@dataclass(frozen=True)
class Expected:
    """What a complete crawl of a :class:`SiteConfig` forum fetches and yields."""

    list_pages: int
    posts: int  # readable (not deleted) posts
    deleted_posts: int
    comment_pages: int
    comments: int
    pages: int  # URLs answered 200: list pages + readable posts + comment pages
    not_found: int  # the 404s of the deleted posts


@dataclass(frozen=True)
class SiteConfig:
    """The shape of the generated forum and the faults it injects."""

    forums: int = 3
    posts_per_forum: int = 100
    posts_per_page: int = 20
    comments_per_page: int = 20
    hot_every: int = 25
    hot_comment_pages: int = 30
    deleted_every: int = 17
    error_rate: float = 0.0
    malformed_rate: float = 0.0
    latency: float = 0.0
    seed: int = 1
    rate_limit: float = 0.0  # accepted requests per second before 429s; 0: no limit
    retry_after: int = 1  # seconds, in the Retry-After header of a rate-limit 429
    rate_limit_status: int = 429  # 429 with Retry-After, or 503 without, above rate_limit
    # forums that grow while the site runs: new posts per minute, by forum (cycled over
    # the forums; () none), from the unix time growth_from on
    growth: tuple[float, ...] = ()
    growth_from: float = 0.0
    listed: int = 0  # list pages show only each forum's newest `listed` posts; 0: all

    def __post_init__(self) -> None:
        if not 0 <= self.posts_per_forum < POST_ID_STRIDE:
            raise ValueError(f"posts_per_forum must be in [0, {POST_ID_STRIDE})")
        if not 0 <= self.forums < POST_ID_STRIDE:
            raise ValueError(f"forums must be in [0, {POST_ID_STRIDE})")
        if min(self.posts_per_page, self.comments_per_page) < 1:
            raise ValueError("page sizes must be at least 1")
        if not (0.0 <= self.error_rate <= 1.0 and 0.0 <= self.malformed_rate <= 1.0):
            raise ValueError("error_rate and malformed_rate must be in [0, 1]")
        self._check_politeness()
        if any(not (math.isfinite(rate) and rate >= 0) for rate in self.growth):
            raise ValueError("growth rates are posts per minute, 0 or more")
        if self.listed < 0:
            raise ValueError("listed is the number of newest posts listed, 0 (all) or more")

    def _check_politeness(self) -> None:
        if self.rate_limit < 0 or self.retry_after < 0:
            raise ValueError("rate_limit and retry_after must not be negative")
        if self.rate_limit_status not in (429, 503):
            raise ValueError("rate_limit_status is 429 or 503")

    def max_page(self, posts: int | None = None) -> int:
        """List pages of each forum, or of one of ``posts`` (an empty forum still has page 1)."""
        count = self.posts_per_forum if posts is None else posts
        return max(1, math.ceil(count / self.posts_per_page))

    def growth_of(self, index: int) -> float:
        """New posts per minute of forum ``index`` (1-based) while the site runs."""
        return self.growth[(index - 1) % len(self.growth)] if self.growth else 0.0

    def posts_in(self, index: int, now: float | None = None) -> int:
        """The posts forum ``index`` lists at unix time ``now`` (None: its first ones)."""
        rate = self.growth_of(index)
        if now is None or rate <= 0 or now < self.growth_from:
            return self.posts_per_forum
        grown = int((now - self.growth_from) * rate / 60)
        return min(self.posts_per_forum + grown, POST_ID_STRIDE - 1)

    def appeared_at(self, index: int, ordinal: int) -> float | None:
        """When a post that grew appeared (unix time); None for the first posts."""
        rate = self.growth_of(index)
        if ordinal < self.posts_per_forum or rate <= 0:
            return None
        return self.growth_from + (ordinal - self.posts_per_forum + 1) * 60 / rate

    def forum_ids(self) -> list[str]:
        return [forum_id(index) for index in range(1, self.forums + 1)]

    def post_ids(self) -> list[str]:
        """Every listed post, deleted ones included, forum by forum."""
        return [
            post_id(index, ordinal)
            for index in range(1, self.forums + 1)
            for ordinal in range(self.posts_per_forum)
        ]

    def locate(self, post: str, now: float | None = None) -> tuple[int, int] | None:
        """(forum index, post ordinal) of a post id, or None if there is no such post
        (at unix time ``now``, for a forum that grows)."""
        number = parse_int(post)
        if number is None:
            return None
        index, ordinal = divmod(number, POST_ID_STRIDE)
        if 1 <= index <= self.forums and ordinal < self.posts_in(index, now):
            return index, ordinal
        return None

    def is_deleted(self, ordinal: int) -> bool:
        return self.deleted_every > 0 and (ordinal + 1) % self.deleted_every == 0

    def is_hot(self, ordinal: int) -> bool:
        hot = self.hot_every > 0 and (ordinal + 1) % self.hot_every == 0
        return hot and not self.is_deleted(ordinal)

    def comment_count(self, post: str, ordinal: int) -> int:
        if self.is_hot(ordinal):
            return self.hot_comment_pages * self.comments_per_page
        return stable_hash(self.seed, post) % (MAX_PLAIN_COMMENTS + 1)

    def comment_pages(self, count: int) -> int:
        return math.ceil(count / self.comments_per_page)

    def expected(self) -> Expected:
        """The ground truth a complete crawl must reproduce: every post of the forums as
        configured, listed or not (a rolling listing, ``listed``, hides the older ones)."""
        posts = deleted = comment_pages = comments = 0
        for index in range(1, self.forums + 1):
            for ordinal in range(self.posts_per_forum):
                if self.is_deleted(ordinal):
                    deleted += 1
                    continue
                count = self.comment_count(post_id(index, ordinal), ordinal)
                posts += 1
                comments += count
                comment_pages += self.comment_pages(count)
        list_pages = self.forums * self.max_page()
        return Expected(
            list_pages=list_pages,
            posts=posts,
            deleted_posts=deleted,
            comment_pages=comment_pages,
            comments=comments,
            pages=list_pages + posts + comment_pages,
            not_found=deleted,
        )


# -- the data: pure functions of the config and the ids ---------------------


def forum_id(index: int) -> str:
    return f"{index:05d}"


def post_id(index: int, ordinal: int) -> str:
    return str(POST_ID_STRIDE * index + ordinal)


def parse_int(text: str) -> int | None:
    """A non-negative integer written canonically (no sign, no leading zero)."""
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        return None
    return int(text)


def stable_hash(seed: int, text: str) -> int:
    return zlib.crc32(f"{seed}:{text}".encode())


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def title(post: str, ordinal: int) -> str:
    return f"Post number {ordinal + 1} ({post})"


def author(seed: int, key: str) -> str:
    return f"user{stable_hash(seed + 1, key) % 997}"


def list_entry(config: SiteConfig, index: int, ordinal: int) -> Json:
    post = post_id(index, ordinal)
    count = config.comment_count(post, ordinal)
    appeared = config.appeared_at(index, ordinal)
    published = EPOCH + timedelta(hours=ordinal, minutes=index)
    if appeared is not None:
        published = datetime.fromtimestamp(appeared, UTC)
    return {
        "post_id": post,
        "title": title(post, ordinal),
        "author": author(config.seed, post),
        "published_at": iso(published),
        "comment_count": count,
        "last_activity": iso(published + timedelta(minutes=count)),
    }


def list_page(config: SiteConfig, forum: str, page: int, now: float | None = None) -> Json | None:
    if len(forum) != 5 or not (forum.isascii() and forum.isdigit()):
        return None
    index = int(forum)
    if not 1 <= index <= config.forums:
        return None
    posts = config.posts_in(index, now)
    oldest = max(0, posts - config.listed) if config.listed else 0  # a rolling listing
    max_page = config.max_page(posts - oldest)
    if not 1 <= page <= max_page:
        return None
    first = oldest + (page - 1) * config.posts_per_page
    last = min(first + config.posts_per_page, posts)
    return {
        "forum_id": forum,
        "page": page,
        "max_page": max_page,
        "posts": [list_entry(config, index, ordinal) for ordinal in range(first, last)],
        "next_page": page + 1 if page < max_page else None,
    }


def post_page(config: SiteConfig, post: str, now: float | None = None) -> Json | None:
    located = config.locate(post, now)
    if located is None or config.is_deleted(located[1]):
        return None
    index, ordinal = located
    count = config.comment_count(post, ordinal)
    return {
        "post_id": post,
        "forum_id": forum_id(index),
        "title": title(post, ordinal),
        "content": f"Body of post {post}. " * (1 + stable_hash(config.seed, post) % 8),
        "author": author(config.seed, post),
        "views": stable_hash(config.seed + 2, post) % 100_000,
        "comment_count": count,
        "comment_pages": config.comment_pages(count),
    }


def comment(config: SiteConfig, post: str, number: int) -> Json:
    comment_id = f"{post}-{number}"
    mix = stable_hash(config.seed, comment_id)
    parent = None if number == 0 or mix % 3 == 0 else f"{post}-{mix % number}"
    return {
        "comment_id": comment_id,
        "author": author(config.seed, comment_id),
        "content": f"Comment {number} on post {post}.",
        "parent_id": parent,
    }


def comment_page(config: SiteConfig, post: str, page: int, now: float | None = None) -> Json | None:
    located = config.locate(post, now)
    if located is None or config.is_deleted(located[1]):
        return None
    count = config.comment_count(post, located[1])
    pages = config.comment_pages(count)
    if not 1 <= page <= pages:
        return None
    first = (page - 1) * config.comments_per_page
    last = min(first + config.comments_per_page, count)
    return {
        "post_id": post,
        "page": page,
        "comments": [comment(config, post, number) for number in range(first, last)],
        "next_page": page + 1 if page < pages else None,
    }


# -- routing ----------------------------------------------------------------


def _route_list(config: SiteConfig, args: list[str], now: float | None) -> Json | None:
    page = parse_int(args[1])
    return None if page is None else list_page(config, args[0], page, now)


def _route_post(config: SiteConfig, args: list[str], now: float | None) -> Json | None:
    return post_page(config, args[0], now)


def _route_comment(config: SiteConfig, args: list[str], now: float | None) -> Json | None:
    page = parse_int(args[1])
    return None if page is None else comment_page(config, args[0], page, now)


# (first path segment, number of segments) -> handler of the remaining segments
ROUTES: dict[tuple[str, int], Callable[[SiteConfig, list[str], float | None], Json | None]] = {
    ("list", 4): _route_list,
    ("post", 3): _route_post,
    ("comment", 4): _route_comment,
}


def path_kind(path: str) -> str:
    """``list``, ``post``, ``comment`` or ``unknown``: what a path asks for."""
    kind = path.split("/", 2)[1] if path.startswith("/") else ""
    return kind if kind in ("list", "post", "comment") else "unknown"


def render(config: SiteConfig, path: str, now: float | None = None) -> tuple[int, bytes]:
    """Status and JSON body of a GET of ``path`` (query string ignored); at unix time
    ``now`` (default: the clock) for a site whose forums grow."""
    if not config.growth:
        return _render_fixed(config, path)
    return _render(config, path, time.time() if now is None else now)


@lru_cache(maxsize=8192)
def _render_fixed(config: SiteConfig, path: str) -> tuple[int, bytes]:
    return _render(config, path, None)


def _render(config: SiteConfig, path: str, now: float | None) -> tuple[int, bytes]:
    path = path.split("?", 1)[0]
    shown = pages.api_path(path)  # a script-built page: the API's data, as HTML
    parts = (shown or path).split("/")
    handler = ROUTES.get((parts[1], len(parts))) if len(parts) > 1 else None
    payload = handler(config, parts[2:], now) if handler is not None else None
    if payload is None:
        return 404, NOT_FOUND_BODY
    if shown is not None:
        return 200, pages.page(path, payload)
    return 200, json.dumps(payload).encode()


# -- HTTP -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    keep_alive: bool
    body_length: int  # bytes of body to skip; -1 when it cannot be skipped


def parse_request(head: bytes) -> Request | None:
    """The request line and headers up to the blank line, or None if malformed."""
    lines = head.decode("latin-1").split("\r\n")
    words = lines[0].split(" ")
    if len(words) != 3 or words[2] not in ("HTTP/1.1", "HTTP/1.0"):
        return None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip().lower()
    connection = headers.get("connection", "")
    http11 = words[2] == "HTTP/1.1"
    keep_alive = "keep-alive" in connection or (http11 and "close" not in connection)
    length = headers.get("content-length", "0")
    body_length = int(length) if length.isascii() and length.isdigit() else -1
    if "transfer-encoding" in headers:
        body_length = -1
    return Request(words[0], words[1], keep_alive, body_length)


def response_bytes(
    status: int,
    body: bytes,
    keep_alive: bool,
    headers: Mapping[str, str] | None = None,
    content_type: str = JSON_TYPE,
) -> bytes:
    """A whole response; ``headers`` are added after the usual ones."""
    allow = "Allow: GET\r\n" if status == 405 else ""
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"HTTP/1.1 {status} {REASONS[status]}\r\n"
        "Server: celery-crawl-demo\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n"
        f"{allow}{extra}\r\n"
    )
    return head.encode("latin-1") + body


async def skip_body(reader: asyncio.StreamReader, request: Request) -> bool:
    """Read past the body of ``request``; whether the connection can stay open."""
    keep_alive = request.keep_alive and request.method == "GET"
    if keep_alive and not 0 <= request.body_length <= MAX_BODY:
        return False  # a body we cannot skip would desync the next request
    if keep_alive and request.body_length:
        await reader.readexactly(request.body_length)
    return keep_alive


# -- politeness: what arrived when, and 429s ---------------------------------


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request the site served."""

    path: str
    started: float  # time.time() when its head was parsed
    ended: float  # time.time() after its response was written
    status: int


class ArrivalLog:
    """The latest requests served, and the most served at once; thread-safe.

    A request is logged just after its response is written, so a client may
    read the response first: :meth:`wait_idle` before reading the log.
    """

    def __init__(self, maxlen: int = MAX_ARRIVALS) -> None:
        self._lock = threading.Condition(threading.Lock())
        self._arrivals: deque[Arrival] = deque(maxlen=maxlen)
        self._in_flight = 0
        self._max_in_flight = 0

    def enter(self) -> None:
        """A request is being served from now on."""
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def leave(self, arrival: Arrival) -> None:
        """A request entered with :meth:`enter` is done: log it."""
        with self._lock:
            self._in_flight -= 1
            self._arrivals.append(arrival)
            if not self._in_flight:
                self._lock.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is being served; False if ``timeout`` seconds pass first."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._in_flight, timeout)

    def arrivals(self) -> list[Arrival]:
        """A copy of the log, oldest first (in the order the responses ended)."""
        with self._lock:
            return list(self._arrivals)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    @property
    def max_in_flight(self) -> int:
        """The most requests served at once since the start or the last reset."""
        with self._lock:
            return self._max_in_flight

    def reset(self) -> None:
        """Forget the logged requests; the maximum restarts from those in flight now."""
        with self._lock:
            self._arrivals.clear()
            self._max_in_flight = self._in_flight


class Throttle:
    """Which requests get 429: injected ones, then those above the rate; thread-safe."""

    def __init__(self, rate_limit: float, retry_after: int, status: int = 429) -> None:
        self.rate_limit = rate_limit
        self.retry_after = retry_after
        self.status = status
        self._lock = threading.Lock()
        self._accepted: deque[float] = deque()  # arrival times within the window
        self._injected = 0
        self._injected_retry_after = 0

    def inject(self, count: int, retry_after: int) -> None:
        """Answer the next ``count`` requests 429; replaces injections still pending."""
        if count < 0 or retry_after < 0:
            raise ValueError("count and retry_after must not be negative")
        with self._lock:
            self._injected, self._injected_retry_after = count, retry_after

    def check(self, now: float) -> tuple[int, dict[str, str]] | None:
        """Status and headers of a refusal for a request arriving at ``now``, or None."""
        with self._lock:
            if self._injected > 0:
                self._injected -= 1
                return 429, {"Retry-After": str(self._injected_retry_after)}
            if self.rate_limit <= 0:
                return None
            while self._accepted and self._accepted[0] <= now - RATE_WINDOW:
                self._accepted.popleft()
            if len(self._accepted) >= self.rate_limit:
                if self.status == 503:
                    return 503, {}
                return 429, {"Retry-After": str(self.retry_after)}
            self._accepted.append(now)
            return None


class DemoSite:
    """The demo forum on an asyncio server, with counters of what it served."""

    def __init__(self, config: SiteConfig | None = None) -> None:
        self.config = config if config is not None else SiteConfig()
        self.host = "127.0.0.1"
        self.port = 0
        self.requests_served = 0
        self.requests_by_kind: Counter[str] = Counter()
        self.requests_by_path: Counter[str] = Counter()
        self.last_request_at: dict[str, float] = {}  # path -> time.monotonic()
        self.answered_paths: set[str] = set()  # answered for good: no fault, neither 503 nor cut
        self.first_request_time: float | None = None
        self.responses_by_status: Counter[int] = Counter()
        self.log = ArrivalLog()
        config = self.config
        self._throttle = Throttle(config.rate_limit, config.retry_after, config.rate_limit_status)
        self._rng = random.Random(self.config.seed)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._answering = threading.Event()  # cleared: responses are held (a test's gate)
        self._answering.set()
        self._held_lock = threading.Lock()
        self._held: Counter[str] = Counter()  # path -> responses held now

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = await asyncio.start_server(
            self._serve_connection, host, port, limit=MAX_HEAD, backlog=1024
        )
        self.host = host
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every open connection."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    def answer_429(self, count: int = 1, retry_after: int = 2) -> None:
        """Answer the next ``count`` requests, any path, 429 with ``Retry-After``.

        Thread-safe; replaces injected 429s still pending.
        """
        self._throttle.inject(count, retry_after)

    def answer(
        self, request: Request, arrived: float | None = None
    ) -> tuple[int, bytes, dict[str, str]]:
        """Status, body and extra headers for one request, faults included; counts it.

        ``arrived`` (time.time() by default) places the request in the rate window.
        """
        self.requests_served += 1
        self.requests_by_kind[path_kind(request.path)] += 1
        self.requests_by_path[request.path] += 1
        now = time.monotonic()
        self.last_request_at[request.path] = now
        if self.first_request_time is None:
            self.first_request_time = now
        refused = self._throttle.check(time.time() if arrived is None else arrived)
        if refused is not None:
            status, headers = refused
            body = ERROR_BODIES[status]
        else:
            (status, body), headers = self._answer(request), {}
        self.responses_by_status[status] += 1
        return status, body, headers

    def hold(self) -> None:
        """Hold every response from now on until :meth:`release`: each request waits,
        unanswered, so that a test can act while a client waits on one. A held request is
        already counted as served, its answer decided. Thread-safe."""
        self._answering.clear()

    def release(self) -> None:
        """Send the held responses, and answer as before. Thread-safe."""
        self._answering.set()

    def held_paths(self) -> list[str]:
        """The paths of the responses held now, each once. Thread-safe."""
        with self._held_lock:
            return list(+self._held)

    async def _wait_release(self, path: str) -> None:
        with self._held_lock:
            self._held[path] += 1
        try:
            while not self._answering.is_set():
                await asyncio.sleep(HOLD_POLL)
        finally:
            with self._held_lock:
                self._held[path] -= 1

    def _answer(self, request: Request) -> tuple[int, bytes]:
        if request.method != "GET":
            return 405, ERROR_BODIES[405]
        if self._draw(self.config.error_rate):
            return 503, ERROR_BODIES[503]
        status, body = render(self.config, request.path)
        if status == 200 and self._draw(self.config.malformed_rate):
            return status, body[: len(body) // 2]  # a cut JSON object never parses
        self.answered_paths.add(request.path)
        return status, body

    def _draw(self, rate: float) -> bool:
        """True with probability ``rate``; a zero rate leaves the RNG untouched."""
        return rate > 0 and self._rng.random() < rate

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None  # a client_connected_cb always runs as a task
        self._connections.add(task)
        try:
            while await self._serve_request(reader, writer):
                pass
        except (
            ConnectionError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass  # the client went away, idled out, or sent an oversized head
        except asyncio.CancelledError:
            pass  # stop() dropped us; asyncio 3.11 logs a cancelled handler as an error
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; whether the connection stays open."""
        async with asyncio.timeout(IDLE_TIMEOUT):
            head = await reader.readuntil(b"\r\n\r\n")
        request = parse_request(head)
        if request is None:
            writer.write(response_bytes(400, ERROR_BODIES[400], keep_alive=False))
            await writer.drain()
            return False
        started = time.time()
        status, body, headers = self.answer(request, started)  # no await since parsing
        self.log.enter()
        try:
            keep_alive = await skip_body(reader, request)
            if not self._answering.is_set():
                await self._wait_release(request.path)
            if self.config.latency > 0:
                await asyncio.sleep(self.config.latency)
            html = status == 200 and pages.api_path(request.path.split("?", 1)[0])
            kind = pages.CONTENT_TYPE if html else JSON_TYPE
            writer.write(response_bytes(status, body, keep_alive, headers, kind))
            await writer.drain()
        finally:
            self.log.leave(Arrival(request.path, started, time.time(), status))
        return keep_alive


class SiteThread:
    """A :class:`DemoSite` on its own event loop in a daemon thread."""

    def __init__(self, config: SiteConfig | None = None, host: str = "127.0.0.1", port: int = 0):
        self.site = DemoSite(config)
        self._address = (host, port)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="demo-site", daemon=True)

    @property
    def url(self) -> str:
        return self.site.url

    @property
    def port(self) -> int:
        return self.site.port

    @property
    def requests_served(self) -> int:
        return self.site.requests_served

    @property
    def rate_limited(self) -> int:
        """Requests answered 429 (above the rate limit, or injected)."""
        return self.site.responses_by_status[429]

    def arrivals(self) -> list[Arrival]:
        """A copy of the site's arrival log, oldest first."""
        return self.site.log.arrivals()

    @property
    def max_in_flight(self) -> int:
        """The most requests the site served at once since the start or :meth:`reset_log`."""
        return self.site.log.max_in_flight

    def reset_log(self) -> None:
        """Clear the arrival log and the maximum of requests in flight."""
        self.site.log.reset()

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until no request is in flight, so every response a client got is logged.

        False if ``timeout`` seconds pass first.
        """
        return self.site.log.wait_idle(timeout)

    def answer_429(self, count: int = 1, retry_after: int = 2) -> None:
        """Answer the next ``count`` requests 429 with ``Retry-After: <retry_after>``."""
        self.site.answer_429(count, retry_after)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """No response is sent inside the block (:meth:`DemoSite.hold`); the held ones go
        when it ends."""
        self.site.hold()
        try:
            yield
        finally:
            self.site.release()

    def held_paths(self) -> list[str]:
        """The paths of the responses held now (:meth:`held`)."""
        return self.site.held_paths()

    def start(self) -> SiteThread:
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise RuntimeError("demo site did not start within 10 s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        """Stop the server and the thread; safe to call twice."""
        loop = self._loop
        if loop is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=10)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self.site.start(*self._address))
        except BaseException as exc:  # handed to the thread that called start()
            self._error = exc
            loop.close()
            self._ready.set()
            return
        self._loop = loop
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self.site.stop())
        loop.close()

    def __enter__(self) -> SiteThread:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def run_in_thread(
    config: SiteConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> SiteThread:
    """Start a demo site in a background thread; use it as a context manager.

    ``with run_in_thread(SiteConfig(forums=2)) as site: fetch(site.url + "/list/00001/1")``
    """
    return SiteThread(config, host, port).start()


# -- command line -----------------------------------------------------------


def _parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Serve the demo forum API.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (loopback)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--forums", type=int, default=SiteConfig.forums)
    parser.add_argument("--posts", type=int, default=SiteConfig.posts_per_forum)
    parser.add_argument("--error-rate", type=float, default=0.0)
    parser.add_argument("--malformed-rate", type=float, default=0.0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per response")
    parser.add_argument("--seed", type=int, default=SiteConfig.seed)
    parser.add_argument(
        "--rate-limit",
        type=float,
        default=SiteConfig.rate_limit,
        help="answer 429 with Retry-After above this many requests per second; 0: no limit",
    )
    parser.add_argument(
        "--retry-after",
        type=int,
        default=SiteConfig.retry_after,
        help="seconds in the Retry-After header of a rate-limit 429",
    )
    parser.add_argument(
        "--rate-limit-status",
        type=int,
        choices=(429, 503),
        default=SiteConfig.rate_limit_status,
        help="answer above the rate limit 429 with Retry-After, or 503 without (overloaded)",
    )
    parser.add_argument(
        "--growth",
        type=_growth,
        default=(),
        help="forums that grow while it runs: new posts per minute, comma-separated, cycled"
        " over the forums (e.g. 6,1,0.05: a busy, a steady and a quiet forum in turn)",
    )
    parser.add_argument(
        "--listed",
        type=int,
        default=0,
        help="a rolling listing: list only each forum's newest N posts (0: all of them)",
    )
    return parser


def _growth(text: str) -> tuple[float, ...]:
    """``--growth 10,2,0.2``: posts per minute, each a finite number, 0 or more."""
    try:
        rates = tuple(float(rate) for rate in text.split(",") if rate.strip())
    except ValueError:
        rates = (-1.0,)
    if any(not (math.isfinite(rate) and rate >= 0) for rate in rates):
        raise argparse.ArgumentTypeError(f"{text!r}: posts per minute, e.g. 10,2,0.2")
    return rates


def config_from_args(args: argparse.Namespace) -> SiteConfig:
    """The :class:`SiteConfig` of parsed :func:`_parser` options."""
    return SiteConfig(
        forums=args.forums,
        posts_per_forum=args.posts,
        error_rate=args.error_rate,
        malformed_rate=args.malformed_rate,
        latency=args.latency,
        seed=args.seed,
        rate_limit=args.rate_limit,
        retry_after=args.retry_after,
        rate_limit_status=args.rate_limit_status,
        growth=args.growth,
        growth_from=time.time(),
        listed=args.listed,
    )


async def serve_forever(config: SiteConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    site = DemoSite(config)
    await site.start(host, port)
    print(f"demo forum at {site.url}: {config.expected()}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await site.stop()


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = _parser(prog).parse_args(argv)
    config = config_from_args(args)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_forever(config, args.host, args.port))
    except OSError as exc:  # the port is taken, or the address is not this machine's
        print(
            f"error: cannot serve on {args.host}:{args.port}: {exc.strerror or exc};"
            " pick another with --port (or --host)",
            file=sys.stderr,
        )
        return 2
    return 0


# `celery-crawl site`, through the library's `celery_crawl.commands` entry points
command = typer.Typer(add_completion=False)


@command.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def site(context: typer.Context) -> None:
    """Serve the demo forum site (options: see `celery-crawl site --help`)."""
    raise typer.Exit(main(context.args, prog=context.command_path))


if __name__ == "__main__":
    raise SystemExit(main())
