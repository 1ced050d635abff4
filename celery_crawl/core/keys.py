"""Every Redis key celery_crawl uses, defined in this one module, but for the names of a
dedup filter's keys under its ``dupefilter`` key, which vary with its kind
(:mod:`celery_crawl.dupefilter.keys`).

Templates use the ``%(name)s`` style of scrapy-redis so that its settings
(``SCHEDULER_QUEUE_KEY = "%(spider)s:requests"``) carry over unchanged. The
spider name is always rendered inside a hash tag, ``{spider}``, so that all
keys of one spider live in one Redis Cluster slot and a Lua script may touch
any of them.

Spiders can form a **group** (``CELERY_CRAWL_SPIDER_GROUPS = {"forum_detail":
"forum"}``): a member's keys render as ``{forum}/forum_detail``, in the group's
hash tag, and its jobs live under the group's job prefix. One job can then span
the group's spiders (list pages in one, posts in another), and the scripts
that count a job stay within one slot. A spider outside any group is its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_crawl.core.defaults import SETTINGS, setting
from celery_crawl.core.errors import ConfigError
from celery_crawl.core.scripts import lua_value

DEFAULT_PREFIX: str = SETTINGS["CELERY_CRAWL_KEY_PREFIX"].default

QUEUE_TEMPLATE: str = SETTINGS["SCHEDULER_QUEUE_KEY"].default
DUPEFILTER_TEMPLATE: str = SETTINGS["SCHEDULER_DUPEFILTER_KEY"].default
STATS_TEMPLATE: str = SETTINGS["STATS_KEY"].default
DEADLETTER_TEMPLATE: str = SETTINGS["SCHEDULER_DEADLETTER_KEY"].default
JOB_TEMPLATE = "%(prefix)s:%(spider)s:job:"
SITE_TEMPLATE = "%(prefix)s:%(spider)s:site:"
PRODUCER_TEMPLATE = "%(prefix)s:%(spider)s:producer"
COOKIES_TEMPLATE = "%(prefix)s:%(spider)s:cookies"
# the keys beside a group's job hashes, after its job prefix (``SpiderKeys.job_prefix``):
# each job's, after its id, and the prefix's own; the Lua's names for them are generated
# from these (:func:`lua_job_keys`)
JOB_PARTICIPANTS = ":participants"
JOB_DONE = ":done"
JOB_SEEN = ":seen"
JOB_STATES = "~states"
ACTIVE_JOBS = "~active"
JOB_ENDED = "~ended:"
# the keys derived from a queue key Q (``SpiderKeys.queue``) and from a group's site
# prefix S (``SpiderKeys.site_prefix``): Q:<priority> a level list (of Q, or of a site's
# parked index), Q:parked, Q:parked:<site>, Q:signal; S<site>, S<site>:leases,
# S<site>:waiting, S~known, S~limits. Scripts derive them from the Q and S passed in KEYS
# (which levels and sites a call meets is known only inside it), with the Lua functions
# generated from these (:func:`lua_queue_keys`)
LEVEL = ":"
PARKED = ":parked"
SIGNAL = ":signal"
SITE_LEASES = ":leases"
SITE_WAITING = ":waiting"
SITE_KNOWN = "~known"
SITE_LIMITS = "~limits"
# a stats hash H's per-minute counts: H:rate:<minute>, the minute of the server's clock,
# which only the script knows (``stats/lua/stats_update.lua``, :func:`lua_stats_keys`)
STATS_RATE = ":rate:"

# a dedup filter's count of fingerprints, D:count under the spider's dupefilter key D (the
# scripts take it in KEYS); the filter's other keys are its package's
# (``celery_crawl.dupefilter.keys``)
DEDUP_COUNT = "count"


def key_name(*parts: str) -> str:
    """A key's name from its parts, joined by ``:`` as every key of the project is."""
    return ":".join(parts)


# a writer's record of its last numbered call (``written``, ``stats_written``): kept past
# any outage a retry could wait out, then gone with the writer (a stopped process)
WRITTEN_KEPT_MS = 3_600_000


def lua_job_keys() -> str:
    """The Lua names of the keys beside the job hashes of ``JOB_PREFIX`` (``jobs/lua``)."""
    per_job = {"participants": JOB_PARTICIPANTS, "done": JOB_DONE, "seen": JOB_SEEN}
    lines = [
        f"local JOB_STATES_KEY = JOB_PREFIX .. {lua_value(JOB_STATES)}",
        f"local ACTIVE_JOBS_KEY = JOB_PREFIX .. {lua_value(ACTIVE_JOBS)}",
        "local function job_ended_key(participant)",
        f"    return JOB_PREFIX .. {lua_value(JOB_ENDED)} .. participant",
        "end",
    ]
    for name, suffix in per_job.items():
        lines += [f"local function job_{name}_key(job)"]
        lines += [f"    return JOB_PREFIX .. job .. {lua_value(suffix)}", "end"]
    return "\n".join(lines)


def lua_queue_keys() -> str:
    """The Lua functions that name the keys derived from a queue key and a site prefix
    (``core/lua/include/keys.lua``): ``levels`` is a queue key, ``sites`` a site prefix."""
    parked_site = lua_value(PARKED + LEVEL)
    functions = {
        "level_key(levels, priority)": f"levels .. {lua_value(LEVEL)} .. priority",
        "parked_key(levels)": f"levels .. {lua_value(PARKED)}",
        "site_parked_key(levels, site)": f"levels .. {parked_site} .. site",
        "signal_key(levels)": f"levels .. {lua_value(SIGNAL)}",
        "site_key(sites, site)": "sites .. site",
        "site_leases_key(sites, site)": f"sites .. site .. {lua_value(SITE_LEASES)}",
        "site_waiting_key(sites, site)": f"sites .. site .. {lua_value(SITE_WAITING)}",
        "site_known_key(sites)": f"sites .. {lua_value(SITE_KNOWN)}",
        "site_limits_key(sites)": f"sites .. {lua_value(SITE_LIMITS)}",
    }
    return "\n".join(
        f"local function {head}\n    return {body}\nend" for head, body in functions.items()
    )


def lua_stats_keys() -> str:
    """The Lua name of a stats hash's per-minute counts (``stats/lua/stats_update.lua``)."""
    return "\n".join(
        [
            "local function stats_rate_key(stats, minute)",
            f"    return stats .. {lua_value(STATS_RATE)} .. minute",
            "end",
        ]
    )


def job_spider(prefix: str, job_id: str) -> str:
    """The spider of a job, so a job can be found from its id alone (expires with the job)."""
    return f"{prefix}:jobspider:{job_id}"


def workers_key(prefix: str) -> str:
    """The worker registry: live worker processes and their spiders
    (``celery_crawl.hosting.registry``)."""
    return f"{prefix}:workers"


def robots_key(prefix: str, netloc: str) -> str:
    """Hash: a host's robots.txt, fetched by one process for all (``politeness/robots.py``)."""
    return f"{prefix}:robots:{netloc}"


def stopping_worker(prefix: str, hostname: str) -> str:
    """Set while a worker shuts down warmly, so its job trackers step aside."""
    return f"{prefix}:stopping:{hostname}"


def render(template: str, spider: str, prefix: str, group: str | None = None) -> str:
    """Fill a key template; the spider's group (by default itself) becomes a hash tag."""
    group = group or spider
    if "%(spider)s" not in template:
        raise ConfigError(
            f"key template {template!r} must contain %(spider)s: the spider's hash tag "
            "keeps its keys in one Redis Cluster slot"
        )
    for name in (spider, group):
        if "{" in name or "}" in name:
            raise ConfigError(f"spider or group name {name!r} must not contain braces")
    tagged = "{" + group + "}" + ("" if group == spider else "/" + spider)
    return template % {"spider": tagged, "prefix": prefix}


def render_loose(template: str, spider: str, prefix: str, group: str | None = None) -> str:
    """A scrapy-redis start key: ``%(name)s`` means ``%(spider)s``; a key without it is kept as is.

    scrapy-redis spiders name literal keys (``redis_key = "myspider:start_urls"``);
    those still work, also on a Redis Cluster, because the start key is only
    ever read by single commands.
    """
    template = template.replace("%(name)s", "%(spider)s")
    if "%(spider)s" not in template:
        return template.replace("%(prefix)s", prefix)
    return render(template, spider, prefix, group)


def start_urls_key(spider: str, settings: Any, template: str | None = None) -> str:
    """The start key of ``spider``: ``template`` (the spider's ``redis_key``) or the setting."""
    return render_loose(
        template or setting(settings, "REDIS_START_URLS_KEY"),
        spider,
        setting(settings, "CELERY_CRAWL_KEY_PREFIX"),
        group_of(spider, settings),
    )


def items_key(spider: str, settings: Any) -> str:
    """The list ``celery_crawl.pipelines.RedisPipeline`` appends ``spider``'s items to."""
    return render(
        setting(settings, "REDIS_ITEMS_KEY"),
        spider,
        setting(settings, "CELERY_CRAWL_KEY_PREFIX"),
        group_of(spider, settings),
    )


def group_of(spider: str, settings: Any) -> str:
    """The spider's group (``CELERY_CRAWL_SPIDER_GROUPS``); a spider is its own by default."""
    return str(setting(settings, "CELERY_CRAWL_SPIDER_GROUPS").get(spider) or spider)


def group_members(spider: str, settings: Any) -> list[str]:
    """Every spider of ``spider``'s group, the group's own name first."""
    group = group_of(spider, settings)
    groups = setting(settings, "CELERY_CRAWL_SPIDER_GROUPS")
    return [group, *sorted(s for s, g in groups.items() if g == group and s != group)]


@dataclass(frozen=True)
class SpiderKeys:
    """The keys of one spider.

    Queue layout (see ``celery_crawl.queue.queues``): ``queue`` is a sorted set of
    priority levels, ``queue:<priority>`` one list per level, ``queue:inflight``
    the leases, ``queue:seq`` the lease counter, ``queue:signal`` the wake-up list,
    ``queue:schedulers`` the processes that have the queue open, ``queue:crawl`` the
    crawl they make together, ``queue:parked``
    the entries parked under their site; ``site_prefix`` holds the group's sites
    (``celery_crawl.politeness.sites``).
    """

    spider: str
    group: str
    queue: str
    dupefilter: str
    stats: str
    deadletter: str
    job_prefix: str
    producer: str
    cookies: str
    site_prefix: str  # the group's sites: every spider of a group crawls under the same limits

    @property
    def inflight(self) -> str:
        return self.queue + ":inflight"

    @property
    def seq(self) -> str:
        return self.queue + ":seq"

    @property
    def signal(self) -> str:
        return self.queue + SIGNAL

    def written(self, writer: str) -> str:
        """String: a writer's last applied enqueue call, ``<number>:<flags>`` (lua/enqueue)."""
        return f"{self.queue}:written:{writer}"

    @property
    def open_schedulers(self) -> str:
        """Sorted set of the schedulers open on the queue, score = registration deadline (ms)."""
        return self.queue + ":schedulers"

    @property
    def crawl(self) -> str:
        """Hash: the crawl the open schedulers make together
        (``celery_crawl.scheduler.crawl_state``)."""
        return self.queue + ":crawl"

    def site(self, site: str) -> str:
        """A site's shared state: rate, pause, back-offs (``politeness/lua/include/sites.lua``)."""
        return self.site_prefix + site

    def site_leases(self, site: str) -> str:
        """Sorted set: the site's leases held now, score = lease deadline (ms)."""
        return self.site_prefix + site + SITE_LEASES

    @property
    def site_known(self) -> str:
        """Set of the group's sites seen by a lease or a back-off."""
        return self.site_prefix + SITE_KNOWN

    @property
    def site_limits(self) -> str:
        """Hash: site -> its limits over the defaults (``SITE_OVERRIDES``)."""
        return self.site_prefix + SITE_LIMITS

    @property
    def parked(self) -> str:
        """Sorted set: sites with entries parked in this queue, score = when one may go (ms)."""
        return self.queue + PARKED

    def site_parked(self, site: str) -> str:
        """Sorted set: the priority levels of a site's entries parked in this queue; each
        level's list is it, ':', the priority (``politeness/lua/include/sites.lua``)."""
        return self.queue + PARKED + LEVEL + site

    def site_waiting(self, site: str) -> str:
        """Set: the queues (their keys) with entries of the site parked."""
        return self.site_prefix + site + SITE_WAITING

    def level(self, priority: int) -> str:
        return f"{self.queue}{LEVEL}{priority}"

    def job(self, job_id: str) -> str:
        """A job's hash: state, counters and per-job stats (``jobs/lua/include/jobs.lua``)."""
        return self.job_prefix + job_id

    def job_participants(self, job_id: str) -> str:
        """Hash: the schedulers working on a job -> their registration key (``lua/job_join``)."""
        return self.job_prefix + job_id + JOB_PARTICIPANTS

    def job_done(self, job_id: str) -> str:
        """List: the tokens that wake ``Job.wait()`` once the job has ended and been left."""
        return self.job_prefix + job_id + JOB_DONE

    def job_seen(self, job_id: str) -> str:
        """Set: the fingerprints of a job's requests, under the job dedup scope."""
        return self.job_prefix + job_id + JOB_SEEN

    def job_ended(self, scheduler_id: str) -> str:
        """List of the ended jobs a scheduler worked on, until it closes its part of them."""
        return self.job_prefix + JOB_ENDED + scheduler_id

    def cookie_jar(self, job: str, jar: str) -> str:
        """A shared cookie jar (``celery_crawl.cookies.store``): one per job and jar name.

        ``job`` is ``""`` outside hosted jobs: the jar is then the spider's own.
        """
        owner = f"job:{job}" if job else "spider"
        return f"{self.cookies}:{owner}:{jar}"

    @property
    def sources(self) -> str:
        """Set of the producer's sources (e.g. forum ids), editable at run time."""
        return self.producer + ":sources"

    @property
    def producer_running(self) -> str:
        """Hash of source -> reserved job, for jobs produced and not finished."""
        return self.producer + ":running"

    @property
    def producer_cursor(self) -> str:
        return self.producer + ":cursor"

    @property
    def schedule_sources(self) -> str:
        """Hash of source id -> its definition, JSON (``celery_crawl.producer.schedule``)."""
        return self.producer + ":schedule:sources"

    @property
    def schedule_due(self) -> str:
        """Sorted set of the sources waiting for their next job, scored by due time (ms)."""
        return self.producer + ":schedule:due"

    @property
    def schedule_paused(self) -> str:
        """Set of the paused sources: none of their jobs is produced."""
        return self.producer + ":schedule:paused"

    @property
    def schedule_intervals(self) -> str:
        """Hash of source id -> its current interval in seconds (adaptive sources move it)."""
        return self.producer + ":schedule:intervals"

    @property
    def schedule_file(self) -> str:
        """String: the digest of the ``PRODUCER_SOURCES_FILE`` last synced into the schedule."""
        return self.producer + ":schedule:file"

    @property
    def dupefilter_count(self) -> str:
        return key_name(self.dupefilter, DEDUP_COUNT)

    @property
    def stats_types(self) -> str:
        return self.stats + ":types"

    def stats_written(self, writer: str) -> str:
        """String: a stats collector's last applied call number (lua/stats_update)."""
        return f"{self.stats}:written:{writer}"

    def stats_rate(self, minute: int) -> str:
        """Per-minute counts of pages and items (written by ``stats/lua/stats_update.lua``)."""
        return f"{self.stats}{STATS_RATE}{minute}"

    @property
    def job_states(self) -> str:
        """Jobs per phase: queued, running, done, cancelled
        (kept by ``jobs/lua/include/jobs.lua``)."""
        return self.job_prefix + JOB_STATES

    @property
    def active_jobs(self) -> str:
        """Ids of the queued and running jobs (kept by ``jobs/lua/include/jobs.lua``)."""
        return self.job_prefix + ACTIVE_JOBS

    @classmethod
    def build(
        cls,
        spider: str,
        *,
        group: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        queue: str = QUEUE_TEMPLATE,
        dupefilter: str = DUPEFILTER_TEMPLATE,
        stats: str = STATS_TEMPLATE,
        deadletter: str = DEADLETTER_TEMPLATE,
        job: str = JOB_TEMPLATE,
    ) -> SpiderKeys:
        group = group or spider
        return cls(
            spider=spider,
            group=group,
            queue=render(queue, spider, prefix, group),
            dupefilter=render(dupefilter, spider, prefix, group),
            stats=render(stats, spider, prefix, group),
            deadletter=render(deadletter, spider, prefix, group),
            job_prefix=render(job, group, prefix),  # shared by the group: jobs span it
            producer=render(PRODUCER_TEMPLATE, spider, prefix, group),
            cookies=render(COOKIES_TEMPLATE, spider, prefix, group),
            site_prefix=render(SITE_TEMPLATE, group, prefix),  # shared by the group, as jobs
        )

    @classmethod
    def from_settings(cls, spider: str, settings: Any) -> SpiderKeys:
        """Keys from Scrapy settings, accepting the scrapy-redis setting names."""
        return cls.build(
            spider,
            group=group_of(spider, settings),
            prefix=setting(settings, "CELERY_CRAWL_KEY_PREFIX"),
            queue=setting(settings, "SCHEDULER_QUEUE_KEY"),
            dupefilter=setting(settings, "SCHEDULER_DUPEFILTER_KEY"),
            stats=setting(settings, "STATS_KEY"),
            deadletter=setting(settings, "SCHEDULER_DEADLETTER_KEY"),
        )
