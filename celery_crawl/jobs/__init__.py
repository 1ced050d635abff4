"""Layer 1: a job in Redis: its hash, counters, limits and states (``job_*.lua``), the
handle :class:`~celery_crawl.jobs.job.Job` that application code waits on, and the checks of
a job's input."""
