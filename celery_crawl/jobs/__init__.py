"""Layer 1: a job in Redis and what travels with it.

``store`` owns the job's hash, its state machine and every ``job_*.lua`` call;
``handle`` the :class:`~celery_crawl.jobs.handle.Job` that application code waits on,
and :class:`~celery_crawl.jobs.handle.JobStatus`; ``limits`` the table of a job's limits
and their checks; ``stats`` the per-job stats gathered from signals; ``signals`` the meta
keys, the signals and the item -> job map; ``inputs`` the checks of a job's input;
``logcontext`` the spider and job that each log line of a hosted crawler names.
"""

from celery_crawl.core.exports import lazy

# what the old module ``celery_crawl.jobs`` held, from where it lives now
__getattr__ = lazy(
    __name__,
    {},
    fallbacks=[
        "celery_crawl.jobs.handle",
        "celery_crawl.jobs.store",
        "celery_crawl.jobs.signals",
        "celery_crawl.jobs.stats",
        "celery_crawl.jobs.limits",
    ],
)
