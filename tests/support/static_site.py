"""A generated static website on loopback, for spiders that follow links (not the forum's JSON API).

``StaticSite(pages=750)`` serves, deterministically:

- ``/`` and ``/page/{n}.html`` (n in 1..pages): HTML pages, each with a title,
  a paragraph and links to a few other pages (``n+1``, ``2n``, ``n*7 mod pages``,
  and ``/`` every tenth page), so that following every link from ``/`` reaches
  every page, the way a dmoz-style ``CrawlSpider`` crawls;
- ``/sitemap.xml``: a sitemap listing every page;
- ``/feed.xml``: an RSS-style XML feed of ``feed_items`` ``<item>`` nodes,
  each with ``<id>``, ``<title>`` and ``<link>`` to a page;
- ``/feed.csv``: the same items as CSV (``id,title,link``);
- ``POST /login`` with ``user=NAME&password=secret``: sets the ``session``
  cookie ``member-NAME``; ``/members/{n}.html``: 200 with such a cookie (its
  ``<h1 data-user="NAME">`` says whose), 403 without.

With a ``gate`` (a ``threading.Event``), every answer waits until it is set
(at most ``GATE_SECONDS``): a test holds a crawl back until all its processes
are open. Every request is recorded (``hits``: path -> count) so a test can check that
each page was fetched, and fetched once; so is every answer's status
(``statuses``: status -> count), with its time (``arrivals``). With ``robots``, it
serves that as ``/robots.txt``. Bounded: a ``ThreadingHTTPServer`` on
127.0.0.1, stopped when the context manager exits.
"""

from __future__ import annotations

import csv
import io
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

SESSION = "session=member-"  # followed by the user's name
GATE_SECONDS = 60.0  # the longest an answer waits for its gate


@dataclass
class StaticSite:
    pages: int = 750
    feed_items: int = 50
    url: str = ""
    hits: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    gate: threading.Event | None = None
    robots: str | None = None  # the body of /robots.txt; None: it answers 404
    arrivals: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, path)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def links(self, n: int) -> list[int]:
        """The pages page ``n`` links to."""
        targets = {n + 1, 2 * n, (n * 7) % self.pages + 1}
        return sorted(t for t in targets if 1 <= t <= self.pages and t != n)

    def page_paths(self) -> list[str]:
        return [f"/page/{n}.html" for n in range(1, self.pages + 1)]

    def item_ids(self) -> list[str]:
        return [f"item-{i}" for i in range(1, self.feed_items + 1)]

    def record(self, path: str) -> None:
        with self._lock:
            self.hits[path] += 1
            self.arrivals.append((time.monotonic(), path))

    def record_status(self, status: int) -> None:
        with self._lock:
            self.statuses[status] += 1

    def html(self, n: int) -> str:
        links = "".join(f'<li><a href="/page/{t}.html">page {t}</a></li>' for t in self.links(n))
        home = '<a href="/">home</a>' if n % 10 == 0 else ""
        return (
            f"<html><head><title>Page {n}</title></head><body><h1>Page {n}</h1>"
            f"<p class='text'>Text of page {n}.</p><ul>{links}</ul>{home}</body></html>"
        )

    def home(self) -> str:
        start = '<a href="/page/1.html">start</a>'
        return f"<html><head><title>Home</title></head><body>{start}</body></html>"

    def sitemap(self) -> str:
        urls = "".join(f"<url><loc>{self.url}{p}</loc></url>" for p in self.page_paths())
        return (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
        )

    def feed_xml(self) -> str:
        items = "".join(
            f"<item><id>{i}</id><title>Title {i}</title>"
            f"<link>{self.url}/page/{k + 1}.html</link></item>"
            for k, i in enumerate(self.item_ids())
        )
        return f'<?xml version="1.0" encoding="UTF-8"?><rss><channel>{items}</channel></rss>'

    def feed_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["id", "title", "link"])
        for k, i in enumerate(self.item_ids()):
            writer.writerow([i, f"Title {i}", f"{self.url}/page/{k + 1}.html"])
        return out.getvalue()


def page_number(path: str, folder: str) -> int | None:
    if not (path.startswith(folder) and path.endswith(".html")):
        return None
    digits = path[len(folder) : -len(".html")]
    return int(digits) if digits.isdigit() else None


def session_user(cookie_header: str) -> str | None:
    """The user whose session cookie the request sends, or None."""
    for pair in cookie_header.split(";"):
        if pair.strip().startswith(SESSION):
            return pair.strip().removeprefix(SESSION)
    return None


class Handler(BaseHTTPRequestHandler):
    site: StaticSite
    protocol_version = "HTTP/1.1"  # keep-alive, as a real site: no connection per request

    def log_message(self, *args: Any) -> None:
        pass

    def send_response(self, code: int, message: str | None = None) -> None:
        self.site.record_status(code)
        super().send_response(code, message)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self.site.record(path)
        if self.site.gate is not None:
            self.site.gate.wait(GATE_SECONDS)
        body = self.body_for(path)
        if body is None:
            self.answer(404, "text/plain", "not found")
        elif isinstance(body, int):
            self.answer(body, "text/plain", "members only")
        else:
            self.answer(200, *body)

    def body_for(self, path: str) -> tuple[str, str] | int | None:
        site = self.site
        fixed = {
            "/": ("text/html", site.home),
            "/sitemap.xml": ("application/xml", site.sitemap),
            "/feed.xml": ("application/xml", site.feed_xml),
            "/feed.csv": ("text/csv", site.feed_csv),
        }
        if path in fixed:
            kind, make = fixed[path]
            return kind, make()
        if path == "/robots.txt" and site.robots is not None:
            return "text/plain", site.robots
        n = page_number(path, "/page/")
        if n is not None and 1 <= n <= site.pages:
            return "text/html", site.html(n)
        n = page_number(path, "/members/")
        if n is not None and 1 <= n <= site.pages:
            user = session_user(self.headers.get("Cookie") or "")
            if user is None:
                return 403
            heading = f'<h1 data-user="{user}">Member page {n}</h1>'
            return "text/html", f"<html><body>{heading}</body></html>"
        return None

    def do_POST(self) -> None:
        self.site.record(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        form = parse_qs(self.rfile.read(length).decode())
        if self.path != "/login" or form.get("password") != ["secret"]:
            self.answer(403, "text/plain", "bad login")
            return
        self.send_response(200)
        user = (form.get("user") or ["crawler"])[0]
        self.send_header("Set-Cookie", f"{SESSION}{user}; Path=/")
        self.send_header("Content-Type", "text/html")
        payload = b"<html><body>welcome</body></html>"
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def answer(self, status: int, kind: str, text: str) -> None:
        payload = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@contextmanager
def serve(site: StaticSite | None = None) -> Iterator[StaticSite]:
    """Serve ``site`` on a free loopback port for the duration of the block."""
    site = site or StaticSite()
    handler = type("BoundHandler", (Handler,), {"site": site})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    site.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
