"""Pages that need a browser: scrapy-playwright in hosted workers, with Debian's chromium.

The demo site's script-built pages (``celery_crawl.demo.pages``) show no post and no
link to a plain fetch. Two hosted workers crawl them through scrapy-playwright and
must find every item that plain scrapy-playwright finds in one ``scrapy runspider``
process; with one worker killed (``kill -9``) mid-render, nothing is lost and no
Chromium process outlives the workers.

Chromium runs here with one renderer process per browser (``--renderer-process-limit=1``,
:data:`LAUNCH`): its pages share it instead of starting one each. A ``scrapy runspider``
of 208 renders took 30 CPU-seconds with it and 40 without, on 2 cores. No test here
asserts anything of Chromium's renderers; each still starts its own browsers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_crawl import crawl, create_app
from celery_crawl.demo.browser_spiders import PLAIN_HANDLERS, ForumJsSpider
from celery_crawl.demo.pages import api_path
from celery_crawl.demo.site import SiteConfig, SiteThread, run_in_thread
from tests.support import ROOT
from tests.support.debian_tools import debian_tool
from tests.support.procs import stat_fields
from tests.support.waiting import wait_for
from tests.support.workers import Worker, killed_at_end

BROWSER_APP = "tests.support.browser_app"
SPIDER = ROOT / "celery_crawl" / "demo" / "browser_spiders.py"
# 4 forums of 2 list pages each, 100 posts: every test crosses list pages and renders at
# once, and each page is a render (about 0.13 CPU-second of Chromium and Scrapy)
SITE = SiteConfig(forums=4, posts_per_forum=25, posts_per_page=13, seed=11)
FORUMS = SITE.forum_ids()
# the spider's launch options, and one renderer process per browser: given to the workers
# through their environment (CELERY_CRAWL_ENV, above the spider's own settings) and to
# ``scrapy runspider`` on its command line
LAUNCH = json.dumps(
    {
        **ForumJsSpider.custom_settings["PLAYWRIGHT_LAUNCH_OPTIONS"],
        "args": ["--renderer-process-limit=1"],
    }
)
MARK = "CELERY_CRAWL_TEST_BROWSER_MARK"  # in the workers' environment, so their browsers'


@pytest.fixture(autouse=True)
def chromium() -> None:
    debian_tool("chromium", "chromium")


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """Every worker's environment here: Chromium's launch options (:data:`LAUNCH`)."""
    return {**env, "PLAYWRIGHT_LAUNCH_OPTIONS": LAUNCH}


@pytest.fixture
def js_site() -> Iterator[SiteThread]:
    with run_in_thread(SITE) as site:
        yield site


@pytest.fixture
def browser_env(
    env: dict[str, str], js_site: SiteThread, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The workers' environment, and this process's (which makes the seed requests):
    the script-built site."""
    monkeypatch.setenv("FORUM_BASE_URL", js_site.url)
    return {**env, "FORUM_BASE_URL": js_site.url}


@pytest.fixture
def browser_app(browser_env: dict[str, str]) -> Celery:
    return create_app("browser_app", "tests.support.browser_settings")


def items_of(folder: Path, pattern: str) -> list[dict[str, Any]]:
    """Every item of the JSON-lines files in ``folder`` matching ``pattern``."""
    found = []
    for path in sorted(folder.glob(pattern)):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def reference_crawl(site_url: str, folder: Path) -> list[dict[str, Any]]:
    """Plain scrapy-playwright in one process: ``scrapy runspider`` with scrapy-playwright's
    own download handler, its items to a file."""
    out = folder / "reference.jsonl"
    command = [sys.executable, "-m", "scrapy", "runspider", str(SPIDER)]
    command += ["-a", f"forums={','.join(FORUMS)}", "-s", f"FORUM_BASE_URL={site_url}"]
    command += ["-s", f"DOWNLOAD_HANDLERS={json.dumps(PLAIN_HANDLERS)}"]
    command += ["-s", f"PLAYWRIGHT_LAUNCH_OPTIONS={LAUNCH}"]
    command += ["-s", "LOG_LEVEL=INFO", "-O", f"{out}:jsonlines"]
    done = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return items_of(folder, "reference.jsonl")


def browsers_of(mark: str) -> list[int]:
    """Live processes whose environment holds ``mark``: the workers and what they started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = stat_fields(entry.name)[0]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if f"{MARK}={mark}".encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def chromium_of(mark: str) -> list[int]:
    """The marked processes that are Chromium's."""
    names = []
    for pid in browsers_of(mark):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if b"chrom" in command:
            names.append(pid)
    return names


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """:func:`wait_for`, every 0.2 s: each check scans ``/proc`` or reads a job's state."""
    wait_for(check, timeout, what, every=0.2)


@contextlib.contextmanager
def site_of_its_own(
    config: SiteConfig, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[SiteThread, Celery]]:
    """A site for one test, and an app built once it is the seeds' site (``FORUM_BASE_URL``,
    which the app reads as it is created); the workers are given the URL too."""
    with run_in_thread(config) as site:
        monkeypatch.setenv("FORUM_BASE_URL", site.url)
        yield site, create_app("browser_app", "tests.support.browser_settings")


def by_post(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["post_id"]: item for item in items}


@pytest.mark.browser  # Chromium, no timing: one such test at a time, beside the others
def test_two_hosted_workers_render_every_page_as_one_scrapy_playwright_process_does(
    browser_app: Celery,
    browser_env: dict[str, str],
    start_worker: Callable[..., Worker],
    js_site: SiteThread,
    tmp_path: Path,
) -> None:
    """Every item of the reference crawl, none other; a worker killed mid-render loses
    nothing and leaves no Chromium behind; a warm shutdown closes the other's browser."""
    reference = reference_crawl(js_site.url, tmp_path)
    assert len(reference) == SITE.expected().posts  # every post not deleted, rendered
    assert all(item["title"] and item["author"] for item in reference)
    marks = {name: uuid.uuid4().hex for name in ("w1", "w2")}  # each worker's processes'
    workers = {
        name: start_worker(name, pool=pool, concurrency=1, app=BROWSER_APP,
                           extra_env={**browser_env, MARK: marks[name]})
        for name, pool in (("w1", "prefork"), ("w2", "solo"))
    }  # fmt: skip
    job = crawl("forum_js", [{"forum_id": forum} for forum in FORUMS], app=browser_app)
    wait_until(lambda: job.status().pages >= 40, 180, "40 pages rendered")
    assert chromium_of(marks["w1"]) and chromium_of(marks["w2"])  # both render
    mains = browser_main(marks["w1"]) + browser_main(marks["w2"])
    assert mains and all(map(launched_with_limit, mains)), mains  # LAUNCH reached them
    workers["w1"].signal(signal.SIGKILL)  # the worker and its pool process, mid-render
    result = job.wait(timeout=300)
    assert result["state"] == "done", result
    hosted = items_of(tmp_path, "forum_js-*.jsonl")
    assert by_post(hosted) == by_post(reference)  # every item, as one process renders it
    wait_until(lambda: not chromium_of(marks["w1"]), 30, "no chromium of the killed worker")
    assert workers["w2"].stop() == 0
    wait_until(lambda: not browsers_of(marks["w2"]), 30, "no process of the stopped worker")
    print(f"{len(hosted)} items written for {len(reference)} posts; {result['pages']} pages")


@pytest.mark.browser  # Chromium, no timing: one such test at a time, beside the others
def test_two_scrapy_crawl_processes_on_the_shared_queue_render_every_page_once(
    redis_url: str, prefix: str, js_site: SiteThread, tmp_path: Path
) -> None:
    """The same spider in two plain ``scrapy runspider`` processes at once, with
    celery_crawl's scheduler (no Celery): they share the queue and the dedup set, both
    render, and together give every post once, as the browser shows it."""
    shared = {
        "SCHEDULER": "celery_crawl.scheduler.Scheduler",
        "REDIS_URL": redis_url,
        "CELERY_CRAWL_KEY_PREFIX": prefix,
        "FORUM_BASE_URL": js_site.url,
        "LOG_LEVEL": "INFO",
        "TELNETCONSOLE_ENABLED": "False",
        "PLAYWRIGHT_LAUNCH_OPTIONS": LAUNCH,
    }
    command = [sys.executable, "-m", "scrapy", "runspider", str(SPIDER)]
    command += ["-a", f"forums={','.join(FORUMS)}"]
    command += [part for name, value in shared.items() for part in ("-s", f"{name}={value}")]
    with killed_at_end() as procs:
        for n in range(2):
            with (tmp_path / f"shared{n}.log").open("wb") as log:
                out = ["-O", f"{tmp_path / f'shared{n}.jsonl'}:jsonlines"]
                procs.append(
                    subprocess.Popen([*command, *out], cwd=tmp_path, stdout=log, stderr=log)
                )
        codes = [proc.wait(timeout=300) for proc in procs]
    logs = [(tmp_path / f"shared{n}.log").read_text()[-3000:] for n in range(2)]
    assert codes == [0, 0], logs
    parts = [items_of(tmp_path, f"shared{n}.jsonl") for n in range(2)]
    assert all(parts), ([len(part) for part in parts], logs)  # both rendered pages
    posts = [item["post_id"] for part in parts for item in part]
    assert len(posts) == len(set(posts)) == SITE.expected().posts  # each once, every one
    assert all(item["title"] and item["author"] for part in parts for item in part)


def most_renders_at_once(site: SiteThread) -> int:
    """The most page requests (``/js/``) the site served at once: each is a render's
    navigation. Chromium's own requests (``/favicon.ico``, while a page is open) are not."""
    assert site.wait_idle(10)
    events = sorted(
        (moment, step)
        for arrival in site.arrivals()
        if arrival.path.startswith("/js/")
        for moment, step in ((arrival.started, 1), (arrival.ended, -1))
    )  # at the same moment, an end before a start
    return max(itertools.accumulate(step for _, step in events), default=0)


def browser_main(mark: str) -> list[int]:
    """The marked browsers' main processes: those Playwright talks to over a pipe. A child
    that Chromium has forked but not yet turned into another program shows the same
    command line: it is not counted, since its parent is Chromium."""
    chromium = set(chromium_of(mark))
    found = []
    for pid in chromium:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            parent = int(stat_fields(pid)[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
        if b"--remote-debugging-pipe" in command and parent not in chromium:
            found.append(pid)
    return found


def launched_with_limit(pid: int) -> bool:
    """Whether the browser ``pid`` got :data:`LAUNCH`'s renderer limit on its command line."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:  # ended meanwhile
        return True
    return b"--renderer-process-limit=1" in command


@pytest.mark.browser  # Chromium, no timing: one such test at a time, beside the others
def test_a_browser_that_crashes_mid_render_is_started_again_and_loses_no_page(
    browser_app: Celery,
    browser_env: dict[str, str],
    start_worker: Callable[..., Worker],
    js_site: SiteThread,
    tmp_path: Path,
) -> None:
    """kill -9 of the browser (not the worker): the pages it was rendering are rendered again
    by a new browser of the same process; every item is there. Either Playwright sees the
    browser gone, and scrapy-playwright renders them again at once; or it does not, and they
    fail at their deadline and are retried. Without the deadline those waited for good, and
    the job never ended."""
    mark = uuid.uuid4().hex
    worker = start_worker(
        "w1", concurrency=1, app=BROWSER_APP, extra_env={**browser_env, MARK: mark}
    )
    job = crawl("forum_js", [{"forum_id": forum} for forum in FORUMS], app=browser_app)
    wait_until(lambda: job.status().pages >= 30, 180, "30 pages rendered")
    # a render under way when the browser dies, for sure: the site holds its answers, and
    # the browser waits on a page's
    with js_site.held():
        wait_until(lambda: any(map(api_path, js_site.held_paths())), 60, "a page held")
        crashed = browser_main(mark)
        assert len(crashed) == 1, crashed
        os.kill(crashed[0], signal.SIGKILL)
    result = job.wait(timeout=300)
    assert result["state"] == "done", result
    posts = {item["post_id"] for item in items_of(tmp_path, "forum_js-*.jsonl")}
    assert len(posts) == SITE.expected().posts, result
    restarted = browser_main(mark)
    assert restarted and crashed[0] not in restarted  # a new browser, in the same worker
    assert worker.stop() == 0
    # the crawl's stats, logged as the crawler closes: a second browser, and each render that
    # ended at its deadline retried (BROWSER_RENDER_TIMEOUT)
    output = worker.output()
    assert re.search(r"'playwright/browser_count': 2\b", output), output[-3000:]
    timed_out = re.search(r"'browser/render_timeout': (\d+)", output)
    assert result["retries"] >= (int(timed_out[1]) if timed_out else 0), (result, output[-3000:])
    wait_until(lambda: not browsers_of(mark), 30, "no process of the stopped worker")


@pytest.mark.browser  # Chromium, no timing: one such test at a time, beside the others
def test_spiders_hosted_together_share_one_browser_and_its_page_cap(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Two spiders that render, hosted by one worker process, a job of each at once: one
    Chromium serves both, never two; and ``BROWSER_MAX_PAGES`` (3) holds for both together:
    the site never answers more than 3 of its pages at once. The
    second spider uses page methods and ``playwright_include_page``: they work hosted."""
    slow = SiteConfig(forums=2, posts_per_forum=30, posts_per_page=25, latency=0.5, seed=11)
    with site_of_its_own(slow, monkeypatch) as (site, browser_app):
        mark = uuid.uuid4().hex
        limits = {"SITE_CONCURRENCY": "0", "SITE_RATE": "0", "BROWSER_MAX_PAGES": "3"}
        worker_env = {**env, "FORUM_BASE_URL": site.url, MARK: mark, **limits}
        worker = start_worker("w1", concurrency=1, app=BROWSER_APP, extra_env=worker_env)
        spiders = ("forum_js", "forum_js_twin")
        jobs = [
            crawl(spider, [{"forum_id": forum}], app=browser_app)
            for spider, forum in zip(spiders, slow.forum_ids(), strict=True)
        ]
        seen: set[int] = set()

        def finished() -> bool:
            seen.update(browser_main(mark))
            return all(job.status().finished for job in jobs)

        wait_until(finished, 240, "both jobs to end")
        results = [job.status().as_dict() for job in jobs]
        for result in results:
            assert result["state"] == "done" and result["items"] > 0, result
            assert result["browser"] == {"rendered": result["pages"]}, result  # each page
        assert sum(result["items"] for result in results) == slow.expected().posts, results
        twins = items_of(tmp_path, "forum_js_twin-*.jsonl")  # read from its page, and method
        assert len(twins) == results[1]["items"], results
        assert all(item["heading"] == item["title"] and item["elements"] >= 3 for item in twins)
        assert len(seen) == 1, seen  # one browser for both spiders, all along
        # the two spiders rendered at the same time: the cap held for both together
        times = site.site.last_request_at
        spans = [[t for p, t in times.items() if p.startswith(f"/js/post/{n}")] for n in (1, 2)]
        assert max(min(span) for span in spans) < min(max(span) for span in spans), spans
        assert most_renders_at_once(site) == 3, site.site.requests_by_path  # the cap, and used
        assert worker.stop() == 0
        wait_until(lambda: not browsers_of(mark), 30, "no process of the stopped worker")


@pytest.mark.browser  # Chromium, no timing: one such test at a time, beside the others
def test_a_killed_celery_parent_leaves_no_browser_behind(
    browser_app: Celery,
    browser_env: dict[str, str],
    start_worker: Callable[..., Worker],
    js_site: SiteThread,
) -> None:
    """kill -9 of the worker's main process only: its pool process, and the browser that
    process started, do not outlive it."""
    mark = uuid.uuid4().hex
    worker = start_worker(
        "w1", concurrency=1, app=BROWSER_APP, extra_env={**browser_env, MARK: mark}
    )
    job = crawl("forum_js", [{"forum_id": FORUMS[0]}], app=browser_app)
    wait_until(lambda: job.status().pages >= 10, 180, "10 pages rendered")
    assert browser_main(mark)
    os.kill(worker.proc.pid, signal.SIGKILL)  # the parent; its pool process lives on
    wait_until(lambda: not browsers_of(mark), 60, "no process of the killed worker left")


@pytest.mark.alone  # browsers, and timing: a CPU of its own
def test_a_render_slower_than_a_lease_keeps_it_and_site_limits_count_renders(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each page takes 5 s to answer, more than a lease (4 s in the test settings): no
    render loses its lease, so no page is fetched twice; and the site's shared limit of 2
    at once holds for the browser's requests, as for plain ones."""
    slow = SiteConfig(forums=1, posts_per_forum=6, posts_per_page=25, latency=5.0)
    with site_of_its_own(slow, monkeypatch) as (site, browser_app):
        limits = {"FORUM_BASE_URL": site.url, "SITE_CONCURRENCY": "2", "SITE_RATE": "0"}
        start_worker("w1", concurrency=1, app=BROWSER_APP, extra_env={**env, **limits})
        result = crawl("forum_js", [{"forum_id": "00001"}], app=browser_app).wait(timeout=180)
        assert result["state"] == "done" and result["items"] == slow.expected().posts, result
        rendered = {p: n for p, n in site.site.requests_by_path.items() if p.startswith("/js/")}
        assert len(rendered) == 1 + 6 and set(rendered.values()) == {1}, rendered  # each once
        assert result["retries"] == 0, result
        assert most_renders_at_once(site) == 2, site.site.requests_by_path  # the limit, and used


@pytest.mark.alone  # browsers, and each page's exact hits (a retried render adds one)
def test_only_the_pages_that_lack_what_their_callback_needs_are_rendered(
    browser_app: Celery,
    browser_env: dict[str, str],
    start_worker: Callable[..., Worker],
    js_site: SiteThread,
) -> None:
    """forum_mixed asks for no browser: of a forum's posts, those served whole are kept as
    fetched; those built by a script lack ``h1.title`` and are rendered (RenderWhenNeeded)."""
    start_worker("w1", concurrency=1, app=BROWSER_APP, extra_env=browser_env)
    job = crawl("forum_mixed", [{"forum_id": FORUMS[0]}], app=browser_app)
    result = job.wait(timeout=300)
    assert result["state"] == "done", result
    hits = js_site.site.requests_by_path
    served = {p: n for p, n in hits.items() if p.startswith("/html/post/")}
    scripted = {p: n for p, n in hits.items() if p.startswith("/js/post/")}
    readable = [p for p in SITE.post_ids() if p.startswith("1") and SITE.locate(p)]
    readable = [p for p in readable if not SITE.is_deleted(SITE.locate(p)[1])]  # type: ignore[index]
    assert served and set(served.values()) == {1}, served  # plain was enough: once
    # a script-built post: its plain fetch, then its render; a deleted one (404) only once
    rendered = {p for p, n in scripted.items() if n == 2}
    odd = [p for p in readable if int(p) % 2]
    assert rendered == {f"/js/post/{p}" for p in odd}, scripted
    assert result["items"] == len(readable), result  # every post, from either kind
    # the job's own counts: each rendered post rendered once, each served one kept
    counts = {
        "rendered": len(odd),
        "render_needed": len(odd),
        "plain_enough": len(readable) - len(odd),
    }
    assert result["browser"] == counts, result


@pytest.mark.browser  # Chromium, no timing: one such test at a time, beside the others
@pytest.mark.parametrize(
    ("reason", "setting"),
    [("pages", {"BROWSER_RECYCLE_PAGES": "25"}), ("memory", {"BROWSER_RECYCLE_MEMORY_MB": "1"})],
)
def test_the_browser_is_recycled_and_no_page_is_lost(
    browser_app: Celery,
    browser_env: dict[str, str],
    start_worker: Callable[..., Worker],
    reason: str,
    setting: dict[str, str],
) -> None:
    """After 25 renders, or above a memory ceiling (1 MiB: every check), the browser is
    closed between renders and a new one started: every item is there, no render failed,
    and the old browsers are gone."""
    mark = uuid.uuid4().hex
    worker = start_worker(
        "w1", concurrency=1, app=BROWSER_APP, extra_env={**browser_env, MARK: mark, **setting}
    )
    job = crawl("forum_js", [{"forum_id": forum} for forum in FORUMS], app=browser_app)
    seen: set[int] = set()

    def finished() -> bool:
        seen.update(browser_main(mark))
        return job.status().finished

    wait_until(finished, 300, "the job to end")
    result = job.status().as_dict()
    assert result["state"] == "done" and result["items"] == SITE.expected().posts, result
    assert result["retries"] == 0, result  # a recycle waits for the renders under way
    log = worker.output()
    recycled = log.count("browser: recycled after")
    assert recycled >= 3 and f"({reason})" in log, log[-3000:]
    assert len(seen) >= 2  # browsers one after another...
    assert len(browser_main(mark)) == 1  # ...and one at a time
    assert worker.stop() == 0
    wait_until(lambda: not browsers_of(mark), 30, "no process of the stopped worker")


@pytest.mark.alone  # browsers, and timing: a CPU of its own
def test_renders_past_their_deadline_free_their_pages_for_the_next_ones(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pages answer in 10 s, renders may take 4 s, 2 pages at once: the first renders fail at
    their deadline and are retried. Once the site is fast again, every page renders: the
    pages of the renders that timed out were closed, not left holding both places."""
    slow = SiteConfig(forums=1, posts_per_forum=12, posts_per_page=25, latency=10.0)
    with site_of_its_own(slow, monkeypatch) as (site, browser_app):
        tight = {
            "FORUM_BASE_URL": site.url,
            "BROWSER_RENDER_TIMEOUT": "4",
            "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT": "2",
            "RETRY_TIMES": "30",
        }
        start_worker("w1", concurrency=1, app=BROWSER_APP, extra_env={**env, **tight})
        job = crawl("forum_js", [{"forum_id": "00001"}], app=browser_app)
        wait_until(lambda: site.requests_served >= 4, 90, "4 renders past their deadline")
        site.site.config = dataclasses.replace(slow, latency=0.0)  # the site is fast again
        result = job.wait(timeout=120)
        assert result["state"] == "done", result
        assert result["items"] == slow.expected().posts and result["retries"] >= 4, result
