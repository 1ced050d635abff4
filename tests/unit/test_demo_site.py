"""The demo forum serves the forum API, its faults, and the totals it promises."""

from __future__ import annotations

import dataclasses
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from celery_crawl.demo.site import (
    SiteConfig,
    SiteThread,
    _parser,
    config_from_args,
    post_id,
    render,
    run_in_thread,
)
from tests.support.waiting import wait_for

SMALL = SiteConfig(forums=2, posts_per_forum=30)
MAX_FOLLOW = 1000  # bound on next_page chains; far above any page count used here

# loopback only: never through a proxy from the environment
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

LIST_KEYS = {"forum_id", "page", "max_page", "posts", "next_page"}
ENTRY_KEYS = {"post_id", "title", "author", "published_at", "comment_count", "last_activity"}
POST_KEYS = {
    "post_id",
    "forum_id",
    "title",
    "content",
    "author",
    "views",
    "comment_count",
    "comment_pages",
}
COMMENT_PAGE_KEYS = {"post_id", "page", "comments", "next_page"}
COMMENT_KEYS = {"comment_id", "author", "content", "parent_id"}


def fetch(url: str) -> tuple[int, bytes]:
    """Status and body of a GET, error statuses included."""
    try:
        with OPENER.open(url, timeout=5) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def fetch_json(url: str) -> tuple[int, Any]:
    status, body = fetch(url)
    return status, json.loads(body)


@pytest.fixture(scope="module")
def small_site() -> Iterator[SiteThread]:
    with run_in_thread(SMALL) as site:
        yield site


@pytest.fixture(scope="module")
def default_site() -> Iterator[SiteThread]:
    with run_in_thread(SiteConfig()) as site:
        yield site


def test_list_page_shape(small_site: SiteThread) -> None:
    status, page = fetch_json(f"{small_site.url}/list/00001/1")
    assert status == 200
    assert set(page) == LIST_KEYS
    assert page["forum_id"] == "00001"
    assert (page["page"], page["max_page"], page["next_page"]) == (1, 2, 2)
    assert len(page["posts"]) == SMALL.posts_per_page
    for entry in page["posts"]:
        assert set(entry) == ENTRY_KEYS
        assert entry["published_at"].endswith("Z")
        assert entry["last_activity"] >= entry["published_at"]
    assert page["posts"][0]["post_id"] == "100000"


def test_last_list_page_has_no_next_page(small_site: SiteThread) -> None:
    status, page = fetch_json(f"{small_site.url}/list/00002/2")
    assert status == 200
    assert page["next_page"] is None
    assert [entry["post_id"] for entry in page["posts"]] == [
        str(200000 + ordinal) for ordinal in range(20, 30)
    ]


def test_responses_are_utf8_json(small_site: SiteThread) -> None:
    with OPENER.open(f"{small_site.url}/post/100000", timeout=5) as response:
        assert response.headers["Content-Type"] == "application/json; charset=utf-8"
        body = response.read()
        assert int(response.headers["Content-Length"]) == len(body)
    assert set(json.loads(body.decode("utf-8"))) == POST_KEYS


def test_script_built_pages_hold_the_apis_data_and_show_it_only_to_a_script(
    small_site: SiteThread,
) -> None:
    with OPENER.open(f"{small_site.url}/js/list/00001/1", timeout=5) as response:
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        page = response.read().decode()
    _, listing = fetch_json(f"{small_site.url}/list/00001/1")
    data = page.split('<script id="data" type="application/json">', 1)[1].split("</script>")[0]
    assert json.loads(data) == listing  # the API's payload, for the script to write
    body = page.split("<script", 1)[0]  # what a reader sees before the script runs
    assert "<li" not in body and "href" not in body and "Post number" not in body
    status, body = fetch(f"{small_site.url}/js/post/100000")
    assert status == 200 and b'"title": "Post number 1 (100000)"' in body
    assert fetch(f"{small_site.url}/js/post/100016") == (404, b'{"error": "not found"}')
    assert fetch(f"{small_site.url}/js/nothing/1")[0] == 404


def test_a_script_built_page_never_closes_its_data_early() -> None:
    from celery_crawl.demo import pages

    title = "<!--<script></script><b>x</b>&amp;"
    page = pages.page("/js/post/1", {"title": title, "post_id": "1"}).decode()
    data = page.split('type="application/json">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data)["title"] == title and not set("<>&") & set(data)
    assert (
        "<title>&lt;!--&lt;script&gt;&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;&amp;amp;</title>" in page
    )


@pytest.mark.parametrize(
    "path",
    [
        "/list/00003/1",  # unknown forum
        "/list/1/1",  # not a five-digit forum id
        "/list/00001/0",
        "/list/00001/3",  # past the last page
        "/list/00001/01",
        "/post/100016",  # deleted (17th post)
        "/comment/100016/1",
        "/post/100030",  # past the forum's last post
        "/post/300000",  # unknown forum
        "/post/0100000",
        "/comment/100000/99",
        "/comment/100000/0",
        "/nothing/here",
        "/",
        "/list/00001",
    ],
)
def test_not_found(small_site: SiteThread, path: str) -> None:
    assert fetch(small_site.url + path) == (404, b'{"error": "not found"}')


def test_deleted_posts_stay_listed(small_site: SiteThread) -> None:
    _, page = fetch_json(f"{small_site.url}/list/00001/1")
    assert "100016" in [entry["post_id"] for entry in page["posts"]]


def walk_comments(url: str, post_id: str) -> list[dict[str, Any]]:
    """Every comment of a post, following next_page from page 1."""
    comments: list[dict[str, Any]] = []
    page: int | None = 1
    for _ in range(MAX_FOLLOW):
        if page is None:
            return comments
        status, body = fetch_json(f"{url}/comment/{post_id}/{page}")
        assert status == 200
        assert set(body) == COMMENT_PAGE_KEYS
        assert (body["post_id"], body["page"]) == (post_id, page)
        comments.extend(body["comments"])
        page = body["next_page"]
    raise AssertionError("next_page chain did not end")


def test_hot_post_comment_pages_match_the_post(small_site: SiteThread) -> None:
    status, post = fetch_json(f"{small_site.url}/post/100024")  # the 25th post is hot
    assert status == 200
    assert post["comment_pages"] == SMALL.hot_comment_pages
    comments = walk_comments(small_site.url, "100024")
    assert len(comments) == post["comment_count"] == 30 * SMALL.comments_per_page
    past_end = f"{small_site.url}/comment/100024/{post['comment_pages'] + 1}"
    assert fetch(past_end)[0] == 404


def test_comments_point_at_earlier_comments(small_site: SiteThread) -> None:
    _, post = fetch_json(f"{small_site.url}/post/100001")
    comments = walk_comments(small_site.url, "100001")
    assert len(comments) == post["comment_count"]
    seen: set[str] = set()
    for number, comment in enumerate(comments):
        assert set(comment) == COMMENT_KEYS
        assert comment["comment_id"] == f"100001-{number}"
        assert comment["parent_id"] is None or comment["parent_id"] in seen
        seen.add(comment["comment_id"])


def test_posts_without_comments_have_no_comment_page(default_site: SiteThread) -> None:
    config = SiteConfig()
    silent = [
        post_id
        for post_id in config.post_ids()
        if config.comment_count(post_id, ordinal(post_id)) == 0
    ]
    assert silent, "the default forum should have posts without comments"
    status, post = fetch_json(f"{default_site.url}/post/{silent[0]}")
    assert status == 200
    assert (post["comment_count"], post["comment_pages"]) == (0, 0)
    assert fetch(f"{default_site.url}/comment/{silent[0]}/1")[0] == 404


def ordinal(post_id: str) -> int:
    located = SiteConfig().locate(post_id)
    assert located is not None
    return located[1]


@dataclass
class Walk:
    """What a complete, sequential crawl of the demo site saw."""

    pages: int = 0
    list_pages: int = 0
    posts: int = 0
    comment_pages: int = 0
    not_found: int = 0
    comment_ids: set[str] = field(default_factory=set)


def walk_forum(url: str, forum_id: str, walk: Walk) -> None:
    page: int | None = 1
    for _ in range(MAX_FOLLOW):
        if page is None:
            return
        status, body = fetch_json(f"{url}/list/{forum_id}/{page}")
        assert status == 200
        walk.list_pages += 1
        for entry in body["posts"]:
            walk_post(url, entry, walk)
        page = body["next_page"]
    raise AssertionError("list next_page chain did not end")


def walk_post(url: str, entry: dict[str, Any], walk: Walk) -> None:
    status, post = fetch_json(f"{url}/post/{entry['post_id']}")
    if status == 404:
        walk.not_found += 1
        return
    assert post["comment_count"] == entry["comment_count"]
    walk.posts += 1
    if post["comment_count"]:
        comments = walk_comments(url, post["post_id"])
        walk.comment_pages += post["comment_pages"]
        walk.comment_ids.update(comment["comment_id"] for comment in comments)


def test_full_walk_reproduces_expected(small_site: SiteThread) -> None:
    walk = Walk()
    for forum_id in SMALL.forum_ids():
        walk_forum(small_site.url, forum_id, walk)
    expected = SMALL.expected()
    assert walk.list_pages == expected.list_pages
    assert walk.posts == expected.posts
    assert walk.not_found == expected.not_found == expected.deleted_posts
    assert walk.comment_pages == expected.comment_pages
    assert len(walk.comment_ids) == expected.comments
    assert walk.list_pages + walk.posts + walk.comment_pages == expected.pages


def test_keep_alive_reuses_one_connection(small_site: SiteThread) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", small_site.port, timeout=5)
    try:
        connection.request("GET", "/list/00001/1")
        first = connection.getresponse()
        assert (first.status, first.getheader("Connection")) == (200, "keep-alive")
        first.read()
        sock = connection.sock
        connection.request("GET", "/post/100000")
        second = connection.getresponse()
        assert second.status == 200
        assert json.loads(second.read())["post_id"] == "100000"
        assert connection.sock is sock
    finally:
        connection.close()


def test_only_get_is_allowed(small_site: SiteThread) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", small_site.port, timeout=5)
    try:
        connection.request("POST", "/list/00001/1", body=b"{}")
        response = connection.getresponse()
        assert (response.status, response.getheader("Allow")) == (405, "GET")
        assert json.loads(response.read()) == {"error": "method not allowed"}
    finally:
        connection.close()


def test_counters_track_kinds(small_site: SiteThread) -> None:
    site = small_site.site
    before = site.requests_served, dict(site.requests_by_kind)
    fetch(f"{small_site.url}/comment/100000/1")
    fetch(f"{small_site.url}/nothing")
    assert site.requests_served == before[0] + 2
    assert site.requests_by_kind["comment"] == before[1].get("comment", 0) + 1
    assert site.requests_by_kind["unknown"] == before[1].get("unknown", 0) + 1


def test_held_responses_wait_for_the_block_to_end_and_are_then_sent() -> None:
    """A test's gate: inside ``held()`` a request waits, unanswered and listed; it is
    answered when the block ends."""
    with run_in_thread(SMALL) as site, ThreadPoolExecutor(1) as pool:
        with site.held():
            answer = pool.submit(fetch, f"{site.url}/post/100000")
            wait_for(lambda: site.held_paths() == ["/post/100000"], 10, "the request held")
            assert not answer.done()
            assert site.site.log.in_flight == 1
        status, body = answer.result(timeout=10)
        assert (status, json.loads(body)["post_id"]) == (200, "100000")
        assert site.held_paths() == []
        assert fetch(f"{site.url}/post/100001")[0] == 200  # no longer held


def test_error_rate_one_answers_503() -> None:
    with run_in_thread(SiteConfig(forums=1, posts_per_forum=5, error_rate=1.0)) as site:
        for path in ("/list/00001/1", "/post/100000", "/nothing"):
            assert fetch(site.url + path)[0] == 503


def test_transient_errors_can_be_retried() -> None:
    with run_in_thread(SiteConfig(forums=1, posts_per_forum=5, error_rate=0.5)) as site:
        statuses = {fetch(f"{site.url}/post/100000")[0] for _ in range(40)}
    assert statuses == {200, 503}


def test_malformed_rate_one_answers_200_with_invalid_json() -> None:
    with run_in_thread(SiteConfig(forums=1, posts_per_forum=5, malformed_rate=1.0)) as site:
        status, body = fetch(f"{site.url}/list/00001/1")
        assert status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(body)
        assert fetch(f"{site.url}/post/999")[0] == 404  # only 200s are mangled


def test_expected_counts_follow_the_config() -> None:
    config = SiteConfig(forums=3, posts_per_forum=100)
    expected = config.expected()
    assert expected.list_pages == 3 * 5
    assert expected.deleted_posts == 3 * (100 // 17)
    assert expected.posts == 300 - expected.deleted_posts
    assert expected.not_found == expected.deleted_posts
    hot_pages = 3 * 4 * config.hot_comment_pages
    assert expected.comment_pages > hot_pages
    assert expected.pages == expected.list_pages + expected.posts + expected.comment_pages


def test_post_ids_are_unique_across_forums() -> None:
    ids = SiteConfig(forums=4, posts_per_forum=50).post_ids()
    assert len(ids) == len(set(ids)) == 200


def test_an_empty_forum_still_has_page_one() -> None:
    config = SiteConfig(forums=1, posts_per_forum=0)
    assert config.max_page() == 1
    assert config.expected().pages == 1


@pytest.mark.parametrize(
    "overrides",
    [{"posts_per_page": 0}, {"error_rate": 1.5}, {"posts_per_forum": 100_000}],
)
def test_bad_configs_are_refused(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SiteConfig(**overrides)


def test_forums_that_grow_list_new_posts_as_time_passes_each_when_it_appeared() -> None:
    start = 1_800_000_000.0
    config = SiteConfig(forums=2, posts_per_forum=5, posts_per_page=5, growth=(6.0, 0.0))
    config = dataclasses.replace(config, growth_from=start)
    assert config.posts_in(1, start + 30) == 8 and config.posts_in(2, start + 30) == 5
    new = post_id(1, 5)  # the first that grew: it appeared 10 s in
    assert config.appeared_at(1, 5) == start + 10 and config.appeared_at(1, 4) is None
    assert render(config, f"/post/{new}", now=start + 9.9)[0] == 404
    assert render(config, f"/post/{new}", now=start + 10)[0] == 200
    status, body = render(config, "/list/00001/1", now=start + 30)
    page = json.loads(body)
    assert status == 200 and page["max_page"] == 2 and page["next_page"] == 2
    last = json.loads(render(config, "/list/00001/2", now=start + 30)[1])["posts"]
    assert [entry["post_id"] for entry in last] == [post_id(1, 5), post_id(1, 6), post_id(1, 7)]
    assert last[0]["published_at"] == "2027-01-15T08:00:10Z"  # when it appeared
    assert render(config, "/list/00002/2", now=start + 30)[0] == 404  # the quiet one: as it was
    with pytest.raises(ValueError, match="posts per minute"):
        SiteConfig(growth=(-1.0,))


def test_a_rolling_listing_lists_only_the_newest_posts_which_stay_served() -> None:
    start = 1_800_000_000.0
    config = SiteConfig(forums=1, posts_per_forum=5, posts_per_page=2, growth=(6.0,), listed=3)
    config = dataclasses.replace(config, growth_from=start)
    listed = []
    for page in (1, 2):
        body = json.loads(render(config, f"/list/00001/{page}", now=start + 30)[1])
        assert body["max_page"] == 2
        listed += [entry["post_id"] for entry in body["posts"]]
    assert listed == [post_id(1, 5), post_id(1, 6), post_id(1, 7)]  # the newest 3 of 8
    assert render(config, f"/post/{post_id(1, 0)}", now=start + 30)[0] == 200  # still served
    assert render(config, "/list/00001/3", now=start + 30)[0] == 404
    with pytest.raises(ValueError, match="listed"):
        SiteConfig(listed=-1)
    assert config_from_args(_parser().parse_args(["--listed", "40"])).listed == 40


def test_the_command_line_takes_growth_rates_and_refuses_what_is_not_one(capsys: Any) -> None:
    args = _parser().parse_args(["--growth", "10,2,0.2"])
    assert config_from_args(args).growth == (10.0, 2.0, 0.2)
    assert config_from_args(_parser().parse_args([])).growth == ()
    for bad in ("abc", "1,-2", "nan"):
        with pytest.raises(SystemExit):
            _parser().parse_args(["--growth", bad])
    assert "posts per minute" in capsys.readouterr().err
