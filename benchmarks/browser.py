"""Rendered pages per second: one hosted worker process against plain scrapy-playwright.

Both render the demo site's script-built pages (``celery_crawl.demo.pages``) with
Debian's chromium, through the same spider (``celery_crawl.demo.browser_spiders``):

- **celery_crawl**: one ``celery worker --pool solo`` hosting the spider, one job of
  every forum, on a real Redis (``REDIS_URL`` or an embedded Valkey);
- **plain scrapy-playwright**: one ``scrapy runspider`` process of the same spider, with
  scrapy-playwright's own download handler.

Each run gets a fresh site. Rendered pages per second from the site's first request
to its last; the memory of each system's processes (the crawler process, its
Playwright driver and its browser: every process whose environment carries the run's
mark), sampled every second. The target is at least 0.9x for celery_crawl; the
memory over the run is drawn to ``--plot`` (matplotlib, the ``bench`` extra).

    python -m benchmarks.browser [--forums 8] [--posts 250] [--rounds 1] [--plot FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import redis_url, table
from benchmarks.e2e import LOGS, Processes, wait_for
from celery_crawl.demo.browser_spiders import PLAIN_HANDLERS
from celery_crawl.demo.site import SiteConfig, SiteThread, run_in_thread

ROOT = Path(__file__).resolve().parent.parent
SPIDER = ROOT / "celery_crawl" / "demo" / "browser_spiders.py"
MARK = "CELERY_CRAWL_BENCH_MARK"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Run:
    system: str
    pages: int
    seconds: float
    memory: list[tuple[float, int, float]] = field(default_factory=list)  # (s, pages, MiB)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.seconds

    def row(self, anchor: Run | None) -> list[object]:
        mib = [m for _, _, m in self.memory] or [0.0]
        ratio = f"{self.pages_per_s / anchor.pages_per_s:.2f}×" if anchor else ""
        return [
            self.system,
            self.pages,
            f"{self.pages_per_s:.1f}",
            ratio,
            f"{mib[0]:.0f}",
            f"{max(mib):.0f}",
            f"{mib[-1]:.0f}",
        ]


def marked_rss(mark: str) -> float:
    """MiB resident in the processes whose environment holds ``mark``."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARK}={mark}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            total += int((entry / "statm").read_text().split()[1]) * PAGE_SIZE
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return total / 2**20


class Sampler(threading.Thread):
    """Memory of the marked processes and the site's pages answered, every second."""

    def __init__(self, mark: str, site: SiteThread, began: float) -> None:
        super().__init__(daemon=True)
        self.mark, self.site, self.began = mark, site, began
        self.samples: list[tuple[float, int, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            pages = rendered(self.site)
            self.samples.append((time.time() - self.began, pages, marked_rss(self.mark)))


def rendered(site: SiteThread) -> int:
    """The site's script-built pages answered for good: what a browser asked for only
    (Chromium may ask for more, such as ``/favicon.ico``)."""
    return sum(1 for path in list(site.site.answered_paths) if path.startswith("/js/"))


def measure(site: SiteThread, total: int, mark: str, procs: Processes) -> Run:
    sampler = Sampler(mark, site, time.time())
    sampler.start()
    try:
        wait_for(lambda: site.site.first_request_time is not None, 180, "the first request")
        wait_for(lambda: rendered(site) >= total, 900, "the crawl to finish")
    finally:
        sampler.stopping.set()
        sampler.join()
        procs.stop()
    first = site.site.first_request_time or 0.0
    seconds = max(site.site.last_request_at.values()) - first
    return Run("", rendered(site), seconds, sampler.samples)


def run_celery_crawl(url: str, config: SiteConfig) -> Run:
    mark, prefix = uuid.uuid4().hex, f"bench-{uuid.uuid4().hex[:8]}"
    procs = Processes()
    with run_in_thread(config) as site:
        env = {
            **os.environ,
            "REDIS_URL": url,
            "CELERY_CRAWL_KEY_PREFIX": prefix,
            "FORUM_BASE_URL": site.url,
            "PYTHONPATH": str(ROOT),
            MARK: mark,
        }
        os.environ.update({k: env[k] for k in ("REDIS_URL", "CELERY_CRAWL_KEY_PREFIX")})
        os.environ["FORUM_BASE_URL"] = site.url
        from celery_crawl import crawl, create_app

        app = create_app("browser_bench", "benchmarks.browser_settings")
        command = [sys.executable, "-m", "celery", "-A", "benchmarks.browser_app", "worker"]
        command += ["--pool", "solo", "--without-gossip", "--without-mingle"]
        procs.start([*command, "--loglevel", "INFO"], env, "browser-celery_crawl")
        try:
            procs.wait_logged("hosting crawlers", timeout=120)
        except BaseException:
            procs.stop()
            raise
        expected = config.expected()
        for forum in config.forum_ids():
            crawl("forum_js", [{"forum_id": forum}], app=app)
        run = measure(site, expected.list_pages + expected.posts + expected.not_found, mark, procs)
    run.system = "celery_crawl, 1 worker process"
    return run


def run_plain(config: SiteConfig) -> Run:
    mark = uuid.uuid4().hex
    procs = Processes()
    with run_in_thread(config) as site:
        env = {**os.environ, "PYTHONPATH": str(ROOT), MARK: mark}
        command = [sys.executable, "-m", "scrapy", "runspider", str(SPIDER)]
        command += ["-a", f"forums={','.join(config.forum_ids())}"]
        command += ["-s", f"FORUM_BASE_URL={site.url}", "-s", "LOG_LEVEL=INFO"]
        command += ["-s", f"DOWNLOAD_HANDLERS={json.dumps(PLAIN_HANDLERS)}"]  # its own handler
        procs.start(command, env, "browser-plain")
        expected = config.expected()
        run = measure(site, expected.list_pages + expected.posts + expected.not_found, mark, procs)
    run.system = "plain scrapy-playwright, 1 process"
    return run


def plot(runs: list[Run], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4))
    for run in runs:
        axis.plot([p for _, p, _ in run.memory], [m for _, _, m in run.memory], label=run.system)
    axis.set_xlabel("pages rendered")
    axis.set_ylabel("MiB resident (crawler, driver, browser)")
    axis.set_ylim(bottom=0)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forums", type=int, default=8)
    parser.add_argument("--posts", type=int, default=250, help="posts per forum")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--plot", default="", help="a PNG of memory over pages rendered")
    args = parser.parse_args(argv)
    config = SiteConfig(forums=args.forums, posts_per_forum=args.posts, posts_per_page=25)
    LOGS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", "import scrapy_playwright"], check=True)
    ours: list[Run] = []
    plain: list[Run] = []
    with redis_url() as url:
        for number in range(args.rounds):  # interleaved: each round runs both
            ours.append(run_celery_crawl(url, config))
            plain.append(run_plain(config))
            print(f"round {number + 1}: {ours[-1].pages_per_s:.1f} against"
                  f" {plain[-1].pages_per_s:.1f} rendered pages/s", flush=True)  # fmt: skip
    ratios = [a.pages_per_s / b.pages_per_s for a, b in zip(ours, plain, strict=True)]
    median = statistics.median(ratios)
    print(f"\n{args.forums} forums of {args.posts} posts, script-built; {args.rounds} round(s)\n")
    headers = ["system", "pages", "rendered pages/s", "÷ plain", "MiB at start", "peak", "end"]
    rows: list[list[Any]] = []
    for a, b in zip(ours, plain, strict=True):
        rows += [a.row(b), b.row(None)]
    print(table(headers, rows))
    rounds = ", ".join(f"{r:.2f}×" for r in ratios)
    print(f"\ncelery_crawl ÷ plain scrapy-playwright: median {median:.2f}× ({rounds}); target 0.9×")
    if args.plot:
        plot([ours[-1], plain[-1]], args.plot)
        print(f"memory plot: {args.plot}")


if __name__ == "__main__":
    main()
