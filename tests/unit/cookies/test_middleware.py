"""Shared cookie jars on the real server: what one process stores, another sends.

Each "process" is a middleware of its own crawler, with a local copy of its own;
only Redis joins them.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.settings import Settings

from celery_crawl.cookies.middleware import VERSION_META, SharedCookiesMiddleware, check_installed
from celery_crawl.cookies.store import CookieStore, decode_cookie, encode_cookie
from celery_crawl.core.errors import ConfigError, CookieError
from celery_crawl.core.keys import SpiderKeys
from celery_crawl.hosting.project import load_settings
from celery_crawl.jobs.signals import JOB_META, job_finished
from tests.support.ports import free_port

SITE = "http://www.site.test"


class JarSpider(Spider):
    name = "jar"


@pytest.fixture
def process(make_crawler: Any) -> Any:
    """A new process's middleware: ``process(COOKIES_SHARED_REFRESH=60)``."""

    def make(**overrides: Any) -> SharedCookiesMiddleware:
        crawler = make_crawler(JarSpider, **{"COOKIES_SHARED": True, **overrides})
        return SharedCookiesMiddleware.from_crawler(crawler)

    return make


@pytest.fixture
def keys(prefix: str) -> SpiderKeys:
    return SpiderKeys.build("jar", prefix=prefix)


def receive(mw: SharedCookiesMiddleware, url: str, *set_cookies: str, **meta: Any) -> Request:
    """``mw`` fetches ``url`` and gets a response with these Set-Cookie headers."""
    request = Request(url, meta=meta)
    mw.process_request(request)
    mw.process_response(request, Response(url, headers={"Set-Cookie": list(set_cookies)}))
    return request


def sent(mw: SharedCookiesMiddleware, url: str, request: Request | None = None, **meta: Any) -> str:
    """The Cookie header ``mw`` sends with a request for ``url``, its cookies sorted."""
    request = request or Request(url, meta=meta)
    mw.process_request(request)
    header = (request.headers.get("Cookie") or b"").decode()
    return "; ".join(sorted(header.split("; "))) if header else ""


def test_a_cookie_one_process_receives_is_sent_by_another(
    process: Any, keys: SpiderKeys, client: redis.Redis
) -> None:
    login, other = process(), process()
    receive(login, f"{SITE}/login", "session=s1; Path=/")
    assert sent(other, f"{SITE}/members/1.html") == "session=s1"
    jar = keys.cookie_jar("", "default")
    stored = client.hgetall(jar)
    assert json.loads(stored[b"www.site.test|/|session"])["value"] == "s1"
    assert int(stored[b"~version"]) > 0
    assert 0 < client.ttl(jar) <= 86_400
    assert login.crawler.stats.get_value("cookies_shared/stored") == 1


def test_a_request_derived_from_the_login_sees_it_at_once(process: Any) -> None:
    login, other = process(), process(COOKIES_SHARED_REFRESH=3600)
    assert sent(other, f"{SITE}/members/1.html") == ""  # the copy is now fresh for an hour
    receive(login, f"{SITE}/login", "session=s1; Path=/")
    assert sent(other, f"{SITE}/members/2.html") == "", "an hour-old copy may be stale"
    child = Request(f"{SITE}/members/3.html")
    login.stamp(child)  # the engine schedules a request the login's callback yields
    assert child.meta[VERSION_META] > 0
    assert sent(other, "", request=child) == "session=s1"


def test_other_changes_show_after_the_refresh_interval(
    client: redis.Redis, keys: SpiderKeys
) -> None:
    now = [0.0]
    store = CookieStore(client, 60)
    login = SharedCookiesMiddleware(store=store, keys=keys, refresh=5)
    other = SharedCookiesMiddleware(store=store, keys=keys, refresh=5, clock=lambda: now[0])
    assert sent(other, f"{SITE}/a") == ""
    receive(login, f"{SITE}/login", "session=s1; Path=/")
    now[0] = 4.9
    assert sent(other, f"{SITE}/b") == ""
    now[0] = 5.0
    assert sent(other, f"{SITE}/c") == "session=s1"
    assert 0 < client.ttl(keys.cookie_jar("", "default")) <= 60


def test_a_cookie_the_site_deletes_is_deleted_for_every_process(
    process: Any, keys: SpiderKeys, client: redis.Redis
) -> None:
    login, other = process(), process(COOKIES_SHARED_REFRESH=0)
    receive(login, f"{SITE}/login", "session=s1; Path=/", "theme=dark; Path=/")
    assert sent(other, f"{SITE}/x") == "session=s1; theme=dark"
    receive(login, f"{SITE}/logout", "session=gone; Max-Age=0; Path=/")
    assert sent(other, f"{SITE}/y") == "theme=dark"
    assert client.hkeys(keys.cookie_jar("", "default")) == [b"www.site.test|/|theme", b"~version"]


def test_expired_cookies_are_not_sent(process: Any, keys: SpiderKeys, client: redis.Redis) -> None:
    login, other = process(), process(COOKIES_SHARED_REFRESH=0)
    receive(login, f"{SITE}/login", "short=1; Max-Age=1; Path=/", "long=1; Max-Age=600; Path=/")
    assert sent(other, f"{SITE}/x") == "long=1; short=1"
    time.sleep(1.1)  # one second is the smallest lifetime a cookie can have
    assert sent(other, f"{SITE}/y") == "long=1"
    receive(login, f"{SITE}/z", "new=1; Path=/")  # the next change drops the expired one
    assert b"www.site.test|/|short" not in client.hkeys(keys.cookie_jar("", "default"))


def test_domain_path_and_secure_scoping_hold_across_processes(process: Any) -> None:
    login, other = process(), process()
    receive(
        login,
        f"{SITE}/members/login",
        "area=m; Path=/members",
        "site=1; Domain=.site.test; Path=/",
        "host=1; Path=/",
        "tls=1; Secure; Path=/",
    )
    assert sent(other, f"{SITE}/members/1.html") == "area=m; host=1; site=1"
    assert sent(other, f"{SITE}/page/1.html") == "host=1; site=1"
    assert sent(other, "http://shop.site.test/") == "site=1"
    assert sent(other, "http://other.test/") == ""
    assert sent(other, "https://www.site.test/") == "host=1; site=1; tls=1"


def test_jobs_and_cookiejar_keys_keep_their_jars_apart(
    process: Any, keys: SpiderKeys, client: redis.Redis
) -> None:
    login, other = process(), process()
    receive(login, f"{SITE}/login", "session=job1; Path=/", **{JOB_META: "j1"})
    receive(login, f"{SITE}/login", "session=jar7; Path=/", cookiejar=7)
    assert sent(other, f"{SITE}/a", **{JOB_META: "j1"}) == "session=job1"
    assert sent(other, f"{SITE}/b", **{JOB_META: "j2"}) == ""
    assert sent(other, f"{SITE}/c") == ""
    assert sent(other, f"{SITE}/d", cookiejar=7) == "session=jar7"
    assert sent(other, f"{SITE}/e", cookiejar="7") == ""
    assert sent(other, f"{SITE}/f", cookiejar=7, **{JOB_META: "j1"}) == ""
    assert client.exists(keys.cookie_jar("j1", "default"), keys.cookie_jar("", "int.7")) == 2


def test_request_cookies_join_the_shared_jar(process: Any) -> None:
    first, other = process(), process()
    first.process_request(Request(f"{SITE}/", cookies={"lang": "fr"}))
    assert sent(other, f"{SITE}/x") == "lang=fr"


def test_dont_merge_cookies_leaves_the_jar_alone(process: Any) -> None:
    first, other = process(), process()
    receive(first, f"{SITE}/login", "session=s1; Path=/", dont_merge_cookies=True)
    assert sent(other, f"{SITE}/x") == ""


def test_malformed_cookies_in_redis_are_skipped_and_counted(
    process: Any, keys: SpiderKeys, client: redis.Redis
) -> None:
    login, other = process(), process()
    receive(login, f"{SITE}/login", "session=s1; Path=/")
    jar = keys.cookie_jar("", "default")
    client.hset(jar, mapping={"a|/|b": "not json", "c|/|d": '{"name": 1}', "e|/|f": "[]"})
    assert sent(other, f"{SITE}/x") == "session=s1"
    assert other.crawler.stats.get_value("cookies_shared/malformed") == 3


def test_a_write_while_redis_is_away_is_kept_and_stored_later(process: Any) -> None:
    first, other = process(), process(COOKIES_SHARED_REFRESH=0)
    working = first.store
    away = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    first.store = CookieStore(away, 60)
    receive(first, f"{SITE}/login", "session=s1; Path=/")
    assert sent(first, f"{SITE}/x") == "session=s1", "the process keeps its own cookie"
    assert sent(other, f"{SITE}/x") == ""
    assert first.crawler.stats.get_value("cookies_shared/write_errors") >= 1
    first.store = working
    sent(first, f"{SITE}/y")  # the jar's next use stores what is pending
    assert sent(other, f"{SITE}/z") == "session=s1"


def test_without_cookies_shared_it_is_scrapys_middleware(
    make_crawler: Any, client: redis.Redis, prefix: str
) -> None:
    a, b = (SharedCookiesMiddleware.from_crawler(make_crawler(JarSpider)) for _ in range(2))
    assert a.store is None
    receive(a, f"{SITE}/login", "session=s1; Path=/")
    assert sent(a, f"{SITE}/x") == "session=s1"
    assert sent(b, f"{SITE}/x") == ""
    assert not list(client.scan_iter(match=f"{prefix}:*cookies*"))


def test_cookie_json_round_trip_and_rejects() -> None:
    mw = SharedCookiesMiddleware()  # Scrapy's in-process jars
    receive(mw, f"{SITE}/", "a=1; Domain=.site.test; Path=/p; Secure; HttpOnly; Max-Age=60")
    (cookie,) = list(mw.jars[None])
    again = decode_cookie(encode_cookie(cookie))
    assert vars(again) == vars(cookie)
    assert again.has_nonstandard_attr("HttpOnly")
    good = json.loads(encode_cookie(cookie))
    bad_values = [{**good, "expires": "soon"}, {**good, "rest": {"x": 1}}, {"name": "a"}, []]
    for bad in ["{", b"\xff", *map(json.dumps, bad_values)]:
        with pytest.raises(CookieError):
            decode_cookie(bad)


def test_cookies_shared_without_the_middleware_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="SharedCookiesMiddleware is not installed"):
        check_installed(Settings({"COOKIES_SHARED": True}))
    check_installed(Settings({"COOKIES_SHARED": False}))
    hosted = load_settings(None, {"COOKIES_SHARED": True})
    check_installed(hosted)  # hosted crawlers have it in place of Scrapy's
    middlewares = hosted.getwithbase("DOWNLOADER_MIDDLEWARES")
    assert middlewares["celery_crawl.cookies.SharedCookiesMiddleware"] == 700
    assert middlewares["scrapy.downloadermiddlewares.cookies.CookiesMiddleware"] is None


def test_without_cookies_shared_each_job_has_its_own_jars(make_crawler: Any) -> None:
    mw = SharedCookiesMiddleware.from_crawler(make_crawler(JarSpider))
    receive(mw, f"{SITE}/login", "session=plain; Path=/")
    receive(mw, f"{SITE}/login", "session=j1; Path=/", **{JOB_META: "j1"})
    receive(mw, f"{SITE}/login", "session=j1-7; Path=/", cookiejar=7, **{JOB_META: "j1"})
    assert sent(mw, f"{SITE}/a", **{JOB_META: "j1"}) == "session=j1"
    assert sent(mw, f"{SITE}/b", cookiejar=7, **{JOB_META: "j1"}) == "session=j1-7"
    assert sent(mw, f"{SITE}/c", **{JOB_META: "j2"}) == "", "a job starts with empty jars"
    assert sent(mw, f"{SITE}/d") == "session=plain", "outside jobs: Scrapy's jars"
    assert list(mw.jars) == [None], "Scrapy's own jars hold no job's cookies"


def test_a_jobs_jars_are_dropped_when_it_ends_in_the_process(
    make_crawler: Any, process: Any
) -> None:
    """``job_finished`` (celery_crawl.scheduler.participation) drops the job's jars, so memory
    stays flat."""
    here = SharedCookiesMiddleware.from_crawler(make_crawler(JarSpider))
    shared = process()
    for mw in (here, shared):
        for job in ("j1", "j2"):
            receive(mw, f"{SITE}/login", f"session={job}; Path=/", **{JOB_META: job})
        mw.crawler.signals.send_catch_log(job_finished, job_id="j1", stats={}, spider=None)
    assert list(here.job_jars) == ["j2"]
    assert [key.rsplit(":", 2)[-2] for key in shared.local] == ["j2"]
    assert sent(shared, f"{SITE}/a", **{JOB_META: "j1"}) == "session=j1", "still in Redis"


def test_a_jar_of_another_type_is_moved_aside_and_the_requests_go_on(
    process: Any, keys: SpiderKeys, client: redis.Redis
) -> None:
    """Its read (and write) failed with a bare WRONGTYPE, and the request with it."""
    jar = keys.cookie_jar("", "default")
    client.rpush(jar, "not a hash")
    assert sent(process(), f"{SITE}/a") == ""  # refused, the jar moved aside, read again
    assert client.lrange(jar + "~damaged", 0, -1) == [b"not a hash"]
    receive(process(), f"{SITE}/login", "session=s1; Path=/")
    assert sent(process(), f"{SITE}/b") == "session=s1"
