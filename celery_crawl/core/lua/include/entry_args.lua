-- The size of one entry's ARGV group, in every script that enqueues: included, never
-- run alone. Generated from celery_crawl.core.entries.ENTRY_ARGV, the group's one
-- definition; include/push.lua reads the fields of each group in its order.
--
-- Uses: nothing from the including script.
-- Defines: ENTRY_WIDTH, the number of ARGV fields of one entry.

--!generated celery_crawl.core.entries:lua_entry_args
