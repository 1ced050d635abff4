"""Script-built HTML pages of the demo forum: what a browser must render.

``/js/list/<forum>/<page>`` and ``/js/post/<post>`` serve the data of
``/list/...`` and ``/post/...`` (the forum API) as an HTML page whose body is
empty until its script runs: the script reads the page's data from a JSON
``<script>`` element and writes the list of posts (``li.post a``, with
``a#next`` to the next page) or the post (``h1.title``, ``.author``,
``.content``). A plain HTTP fetch sees no post and no link; a browser sees the
page as a reader would. Text is set with ``textContent``, so the page writes
no markup it was not meant to. ``/html/post/<post>`` is the same post rendered by the
server, as a mixed site serves some pages: a plain fetch sees it whole.
"""

from __future__ import annotations

import html
import json
from typing import Any

PREFIX = "/js"
SERVED_PREFIX = "/html"  # the same post, as the server would render it: no script needed
CONTENT_TYPE = "text/html; charset=utf-8"

# what each kind of page writes, from ``data`` (the forum API's payload)
BUILDERS = {
    "list": """
const list = document.createElement("ul");
list.id = "posts";
for (const post of data.posts) {
  const item = document.createElement("li");
  item.className = "post";
  const link = document.createElement("a");
  link.href = "/js/post/" + post.post_id;
  link.textContent = post.title;
  item.appendChild(link);
  list.appendChild(item);
}
main.appendChild(list);
if (data.next_page) {
  const next = document.createElement("a");
  next.id = "next";
  next.href = "/js/list/" + data.forum_id + "/" + data.next_page;
  next.textContent = "next";
  main.appendChild(next);
}
""",
    "post": """
for (const [tag, name, text] of [
  ["h1", "title", data.title], ["span", "author", data.author], ["div", "content", data.content],
]) {
  const node = document.createElement(tag);
  node.className = name;
  node.textContent = text;
  main.appendChild(node);
}
""",
}

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title></head>
<body><main id="content"></main>
<script id="data" type="application/json">{data}</script>
<script>
const data = JSON.parse(document.getElementById("data").textContent);
const main = document.getElementById("content");
{builder}
</script></body></html>
"""


SERVED = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title></head>
<body><main id="content"><h1 class="title">{title}</h1><span class="author">{author}</span>
<div class="content">{content}</div></main></body></html>
"""


def api_path(path: str) -> str | None:
    """The forum API path that ``path``, an HTML page's, shows; None for other paths."""
    for prefix in (PREFIX, SERVED_PREFIX):
        if path.startswith(prefix + "/"):
            rest = path[len(prefix) :]
            kinds = BUILDERS if prefix == PREFIX else ("post",)
            return rest if rest.split("/", 2)[1] in kinds else None
    return None


def page(path: str, payload: dict[str, Any]) -> bytes:
    """The HTML page of ``path`` for the API's ``payload``: written by a script, or, under
    ``/html``, by the server (what a browser would show, with no script to run)."""
    if path.startswith(SERVED_PREFIX + "/"):
        fields = {name: html.escape(str(payload[name])) for name in ("title", "author", "content")}
        return SERVED.format(**fields).encode()
    kind = path[len(PREFIX) :].split("/", 2)[1]
    # no <, > or & in the data: nothing in it can end or reshape its <script> element
    data = json.dumps(payload).replace("<", "\\u003c").replace(">", "\\u003e")
    data = data.replace("&", "\\u0026")
    title = html.escape(str(payload.get("title") or payload.get("forum_id") or kind))
    return PAGE.format(title=title, data=data, builder=BUILDERS[kind]).encode()
