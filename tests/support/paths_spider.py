"""A spider and a tiny site that walk every request path a job must survive.

Each seed is ``{"path": KIND}``; the site answers each kind its own way:
redirects, 404, 500 until retries give up, a 503 that a retry fixes, a
callback that raises, an errback that yields a request, a request dropped by
a downloader middleware, a duplicate child, a slow page whose child comes
last, and a connection refused (a download error). ``EXPECTED_ITEMS`` is what
a complete job yields. A ``{"unqueueable": ID}`` seed's page yields a request
whose meta cannot be encoded.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from scrapy import Request, Spider
from scrapy.exceptions import CloseSpider, IgnoreRequest
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro

from celery_crawl import job_args
from celery_crawl.jobs.signals import acks_due

KINDS = [
    "refused",
    "ok",
    "redirect",
    "missing",
    "always500",
    "flaky",
    "raise",
    "errback",
    "drop",
    "dup",
    "slow",
]
EXPECTED_ITEMS = 9
TREE_LEVELS = 5  # a {"tree": NAME} seed: 2**5 - 1 pages, depths 0 to 4
CHILDREN = {"/ok": ["/ok/child"], "/dup": ["/ok/child", "/ok/dup2"], "/slow": ["/ok/after-slow"]}


# one-page seed kinds: seed key -> (path, with the seed's value in it; callback)
SINGLE = {
    "probe": ("/ok/probe-{}", "parse_leaf"),  # a one-page job
    "unqueueable": ("/ok/unqueueable-{}", "parse_unqueueable"),  # yields what cannot be queued
    "close": ("/ok/close-{}", "parse_close"),  # raises CloseSpider
    # closes the whole crawler, as an extension may
    "stop_crawler": ("/ok/stop-{}", "parse_stop_crawler"),
    # the job's spider arguments, two levels down
    "args": ("/ok/args-{}", "parse_with_args"),
}


class PathsSpider(Spider):
    name = "paths"
    custom_settings: ClassVar[dict[str, Any]] = {
        "RETRY_TIMES": 2,
        "RETRY_HTTP_CODES": [500, 503],
        "DOWNLOADER_MIDDLEWARES": {"tests.support.paths_spider.DropMiddleware": 543},
    }

    @property
    def base(self) -> str:
        return str(self.settings.get("PATHS_BASE_URL")).rstrip("/")

    def single_request(self, seed: dict[str, str]) -> Request | None:
        """The request of a one-page seed kind, or None for the other kinds."""
        for key, (path, callback) in SINGLE.items():
            if key in seed:
                # a spider argument is an attribute of the spider that makes the seed requests
                url = self.base + path.format(seed[key]) + getattr(self, "suffix", "")
                return Request(url, callback=getattr(self, callback), dont_filter=True)
        if "sleep" in seed:  # a slow download: the site answers after this many seconds
            url = f"{self.base}/sleep/{seed['id']}/{seed['sleep']}"
            meta = {"download_timeout": float(seed["sleep"]) + 60}
            return Request(url, callback=self.parse_leaf, meta=meta, dont_filter=True)
        if "block" in seed:  # a callback that holds the reactor this many seconds
            url = f"{self.base}/ok/block-{seed['id']}"
            kwargs = {"seconds": float(seed["block"])}
            return Request(url, callback=self.parse_block, cb_kwargs=kwargs, dont_filter=True)
        if "slow_settle" in seed:  # its items take this many seconds to be made durable
            url = f"{self.base}/ok/slow-settle-{seed['id']}"
            kwargs = {"seconds": float(seed["slow_settle"])}
            return Request(url, callback=self.parse_slow_settle, cb_kwargs=kwargs, dont_filter=True)
        return None

    def requests_from_seed(self, seed: dict[str, str]) -> list[Request]:
        single = self.single_request(seed)
        if single is not None:
            return [single]
        if "fan" in seed:  # one page with `width` children, each a FAN_SECONDS download
            url = f"{self.base}/fan/{seed['fan']}/{seed.get('width', 40)}"
            return [Request(url, callback=self.parse, dont_filter=True)]
        if "tree" in seed:  # a binary tree of pages, 5 levels deep: 31 pages
            url = f"{self.base}/tree/{seed['tree']}/r"
            return [Request(url, callback=self.parse, dont_filter=True)]
        if "chain" in seed:  # a slow job: one page after another, 0.5 s each
            url = f"{self.base}/chain/{seed['chain']}/{seed.get('length', 8)}"
            return [Request(url, callback=self.parse, dont_filter=True)]
        kind = seed["path"]
        if kind not in KINDS:
            raise ValueError(f"unknown path kind {kind!r}")
        if kind == "refused":  # a download error: nothing listens on port 1
            return [Request("http://127.0.0.1:1/refused", callback=self.parse)]
        callback = self.parse_raise if kind == "raise" else self.parse
        errback = self.on_error if kind == "errback" else None
        meta = {"drop": True} if kind == "drop" else {}
        return [Request(f"{self.base}/{kind}", callback=callback, errback=errback, meta=meta)]

    def parse(self, response: Response) -> Iterator[Any]:
        data = json.loads(response.text)
        yield {"path": data["path"]}
        for child in data["children"]:
            yield Request(self.base + child, callback=self.parse)

    def parse_leaf(self, response: Response) -> Iterator[Any]:
        yield {"path": response.url}

    def parse_block(self, response: Response, seconds: float) -> Iterator[Any]:
        time.sleep(seconds)  # on purpose: no reactor turn, so no renewal from the reactor
        yield {"path": response.url}

    def parse_slow_settle(self, response: Response, seconds: float) -> Iterator[Any]:
        """Done with the page; the next write of acks first waits ``seconds`` in ``acks_due``,
        as for a feed on a slow disk: the page's lease is no longer the engine's then."""
        self.settle_seconds = seconds
        self.crawler.signals.connect(self.settle_slowly, acks_due)  # once: the same receiver
        yield {"path": response.url}

    def settle_slowly(self) -> None:
        seconds, self.settle_seconds = getattr(self, "settle_seconds", 0), 0
        time.sleep(seconds)  # on purpose: in the reactor, so no renewal from the reactor

    def parse_with_args(self, response: Response) -> Iterator[Any]:
        """The child's URL, then the grandchild's, carry what job_args() says."""
        category = job_args(response).get("category", "none")
        yield {"path": response.url}
        if "/child-" not in response.url:
            yield Request(f"{response.url}/child-{category}", callback=self.parse_with_args)
        elif "/grandchild-" not in response.url:
            yield Request(f"{response.url}/grandchild-{category}", callback=self.parse_with_args)

    def parse_close(self, response: Response) -> Iterator[Any]:
        yield {"path": response.url}
        raise CloseSpider("enough for this job")

    def parse_stop_crawler(self, response: Response) -> Iterator[Any]:
        yield {"path": response.url}
        deferred_from_coro(self.crawler.engine.close_spider_async(reason="stopped by a test"))

    def parse_unqueueable(self, response: Response) -> Iterator[Any]:
        yield {"path": response.url}
        yield Request(response.url + "/child", callback=self.parse_leaf)
        yield Request(response.url + "/never", callback=self.parse_leaf, meta={"handle": object()})

    def parse_raise(self, response: Response) -> Iterator[Any]:
        raise ValueError("a callback that fails")

    def on_error(self, failure: Any) -> Iterator[Request]:
        yield Request(self.base + "/ok/from-errback", callback=self.parse)


class PathsStartSpider(Spider):
    """Start URLs and no seeds: its jobs are ``crawl("paths_start")``, which run its start()."""

    name = "paths_start"
    pages = 3

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> PathsStartSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        base = str(crawler.settings.get("PATHS_BASE_URL")).rstrip("/")
        spider.start_urls = [f"{base}/ok/start-{n}" for n in range(cls.pages)]
        return spider

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"path": response.url}


class DropMiddleware:
    def process_request(self, request: Request) -> None:
        if request.meta.get("drop"):
            raise IgnoreRequest("dropped by a middleware")


class PathsSite:
    """The site: a threaded HTTP server on loopback, counting hits per path."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.first_hit: dict[str, float] = {}  # path -> time.monotonic() of its first request
        self.hold_first: dict[str, float] = {}  # path -> seconds its first request waits
        self._released = threading.Event()  # set on exit: nothing waits any more
        self._lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                site.answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PathsSite:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path
        with self._lock:
            self.hits[path] += 1
            hits = self.hits[path]
            self.first_hit.setdefault(path, time.monotonic())
        if hits == 1 and path in self.hold_first:  # a download that is still going on
            self._released.wait(self.hold_first[path])
        status, headers, body = self.page(path, hits)
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def page(self, path: str, hits: int) -> tuple[int, dict[str, str], bytes]:
        if path == "/redirect":
            return 302, {"Location": "/ok/r"}, b""
        if path == "/missing":
            return 404, {}, b"{}"
        if path in ("/always500", "/errback") or (path == "/flaky" and hits == 1):
            return 500 if path != "/flaky" else 503, {}, b"{}"
        if path == "/slow":
            time.sleep(1.0)
        if path.startswith("/sleep/"):
            time.sleep(float(path.rsplit("/", 1)[1]))
        body = json.dumps({"path": path, "children": children_of(path)}).encode()
        return 200, {"Content-Type": "application/json"}, body


# how long each child of a fan page takes to answer: the cancel test (test_job_end.py)
# expects most of them still queued when it cancels, also when the cancel comes a second
# late on a loaded machine: the slower each download, the fewer go by in a second's delay
FAN_SECONDS = 1.0


def children_of(path: str) -> list[str]:
    """The links of a page of the site (a chain page takes 0.5 s)."""
    _, kind, *rest = path.split("/")
    if kind == "fan":
        name, width = rest
        return [f"/sleep/fan-{name}-{i}/{FAN_SECONDS}" for i in range(int(width))]
    if kind == "tree":
        name, node = rest
        return [f"/tree/{name}/{node}{c}" for c in "ab"] if len(node) < TREE_LEVELS else []
    if kind == "chain":
        time.sleep(0.5)
        name, left = rest
        return [f"/chain/{name}/{int(left) - 1}"] if int(left) > 1 else []
    return CHILDREN.get(path, [])
