"""A TCP relay to a Redis server that can lose one reply: the command ran, its answer never came.

That is what a client sees when Redis stops (or a connection is cut) right
after running a command: redis-py's retry sends the command again. The relay
listens on loopback and forwards bytes both ways; after :meth:`cut_next_reply`
it closes the connection that the next reply comes on, instead of forwarding
that reply. Connections made after the cut are relayed as usual.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

CHUNK = 65536


class ReplyCutter:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{port}"
        self.url = urlunsplit(
            parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host)
        )
        self.cuts = 0
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="reply cutter", daemon=True).start()

    def cut_next_reply(self) -> None:
        self._cut.set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self._upstream, timeout=10)
            self._sockets += [client, upstream]
            for source, target, replies in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(
                    target=self._pump, args=(source, target, replies), daemon=True
                ).start()

    def _pump(self, source: socket.socket, target: socket.socket, replies: bool) -> None:
        try:
            while data := source.recv(CHUNK):
                if replies and self._cut.is_set():
                    self._cut.clear()
                    self.cuts += 1
                    break  # the reply is dropped with the connection
                target.sendall(data)
        except OSError:
            pass
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> ReplyCutter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
