"""Layer 0, the foundation: settings and their defaults, key names, errors and the bad
values read back, a queued request's wire format (``entries``), the Redis client, the Lua
loader, the repair of damaged keys, and the process's two threads that wait on Redis
(heartbeats; notices). No Celery, no reactor."""
