"""The exporter's HTTP server: its threads, connections and time are bounded, whatever clients do.

prometheus_client's ``start_http_server`` starts a thread per connection and
never times one out, so a client that opens connections and sends nothing
holds a thread each, for ever. Here:

- one thread accepts connections and reads their requests without blocking
  (:mod:`selectors`). A connection has ``request_seconds`` to send its
  request head (``max_head`` bytes at most); at most ``max_connections``
  wait at once, and the oldest is closed to make room for a new one.
- a fixed pool of ``threads`` threads answers complete requests, each
  ``GET /metrics`` one scrape, with a socket time-out of ``request_seconds``
  for the answer. Past ``threads * QUEUED_PER_THREAD`` answers waiting, a
  request is answered ``503`` at once.

Each connection carries one request (HTTP/1.0 style: ``Connection: close``).
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

THREADS = 2
MAX_CONNECTIONS = 64
REQUEST_SECONDS = 5.0
MAX_HEAD = 8192
QUEUED_PER_THREAD = 4
TICK_SECONDS = 0.25  # how often the accepting thread looks for expired connections
PATHS = ("/metrics", "/")

Answer = tuple[int, str, bytes]  # status, content type, body


@dataclass
class _Waiting:
    """A connection whose request head is not complete yet."""

    deadline: float
    head: bytearray = field(default_factory=bytearray)


class BoundedHTTPServer:
    """Serves ``page()`` at :data:`PATHS` on ``(addr, port)``; :meth:`shutdown` stops it."""

    def __init__(
        self,
        addr: str,
        port: int,
        page: Callable[[], Answer],
        *,
        threads: int = THREADS,
        max_connections: int = MAX_CONNECTIONS,
        request_seconds: float = REQUEST_SECONDS,
    ) -> None:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
        self.listener = socket.create_server((addr, port), family=family, backlog=128)
        self.listener.setblocking(False)
        self.page = page
        self.max_connections = max_connections
        self.request_seconds = request_seconds
        self.max_queued = threads * QUEUED_PER_THREAD
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="metrics-answer")
        self._selector = selectors.DefaultSelector()
        self._waiting: dict[socket.socket, _Waiting] = {}  # oldest first
        self._queued = 0  # answers submitted to the pool and not finished
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="metrics-accept", daemon=True)

    def start(self) -> BoundedHTTPServer:
        self._selector.register(self.listener, selectors.EVENT_READ)
        self.thread.start()
        return self

    def shutdown(self) -> None:
        """Stop accepting, close every connection, and let answers under way finish."""
        self._stopped.set()
        self.thread.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the accepting thread ---------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stopped.is_set():
                for key, _ in self._selector.select(TICK_SECONDS):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                self._expire(time.monotonic())
        finally:
            for sock in list(self._waiting):
                self._drop(sock)
            self._selector.close()
            self.listener.close()

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:  # gone before it was accepted
            return
        if len(self._waiting) >= self.max_connections:
            self._drop(next(iter(self._waiting)))
        sock.setblocking(False)
        self._waiting[sock] = _Waiting(time.monotonic() + self.request_seconds)
        self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, sock: socket.socket) -> None:
        waiting = self._waiting.get(sock)
        if waiting is None:  # dropped earlier in this round, to make room
            return
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        waiting.head += data
        if not data or len(waiting.head) > MAX_HEAD:
            self._drop(sock)
        elif b"\r\n\r\n" in waiting.head or b"\n\n" in waiting.head:
            self._release(sock)
            self._submit(sock, bytes(waiting.head))

    def _expire(self, now: float) -> None:
        for sock in [s for s, w in self._waiting.items() if w.deadline <= now]:
            self._drop(sock)

    def _release(self, sock: socket.socket) -> None:
        self._selector.unregister(sock)
        del self._waiting[sock]

    def _drop(self, sock: socket.socket) -> None:
        self._release(sock)
        sock.close()

    def _submit(self, sock: socket.socket, head: bytes) -> None:
        with self._lock:
            busy = self._queued >= self.max_queued
            self._queued += 0 if busy else 1
        if busy:
            _reply(sock, 0.1, (503, "text/plain", b"busy: try again\n"))
            return
        self._pool.submit(self._answer, sock, head)

    # -- the pool's threads -----------------------------------------------------

    def _answer(self, sock: socket.socket, head: bytes) -> None:
        try:
            _reply(sock, self.request_seconds, self._response(head))
        finally:
            with self._lock:
                self._queued -= 1

    def _response(self, head: bytes) -> Answer:
        parts = head.split(b"\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, "text/plain", b"bad request\n"
        if parts[0] not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET /metrics\n"
        if urlsplit(parts[1]).path not in PATHS:
            return 404, "text/plain", b"GET /metrics\n"
        status, kind, body = self.page()
        return status, kind, b"" if parts[0] == "HEAD" else body


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
REASONS |= {500: "Internal Server Error", 503: "Service Unavailable"}


def _reply(sock: socket.socket, seconds: float, answer: Answer) -> None:
    """Send ``answer`` and close; a client too slow to take it within ``seconds`` loses it."""
    status, kind, body = answer
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, '')}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    try:
        sock.settimeout(seconds)
        sock.sendall(head.encode("latin-1") + body)
    except OSError:
        pass
    finally:
        sock.close()
