-- Entries that cannot be read: included, never run alone.
--
-- An entry whose header cannot be read (entry_problem), or whose job is unknown, is
-- poison: the script that meets it takes it out for good, in the same call: a record
-- on the dead-letter list (newest first, kept to DEADLETTER_MAX), the spider's stat
-- celery_crawl/dead_letter/malformed, and, when its job id can be read and the job exists, the
-- job's errors/dead_letter/malformed. It is never leased, so it never reaches a process.
-- The job's pending count is left as it is: poison may never have been counted (written
-- by something else), and a job must never end while requests of it are still queued;
-- a job that did count it ends incomplete once its queues are empty (job_reconcile.lua).
--
-- Uses: DEADLETTER, DEADLETTER_MAX, STATS (the spider's stats hash), QUEUE (the queue
-- key, named in the record); job_exists, job_add, count (include/jobs.lua, included before it).
-- Defines: poison(entry, reason, stage).

local POISON_STAT = 'celery_crawl/dead_letter/malformed'
local POISON_HEX = 512  -- bytes of the entry kept in the record

local function poison(entry, reason, stage)
    local clock = redis.call('TIME')
    local record = cjson.encode({reason = 'malformed', error = reason, stage = stage,
        queue = QUEUE, at = clock[1] + clock[2] / 1000000, entry_hex = entry_hex(entry, POISON_HEX)})
    redis.call('LPUSH', DEADLETTER, record)
    redis.call('LTRIM', DEADLETTER, 0, DEADLETTER_MAX - 1)
    count(STATS, POISON_STAT, 1)
    local size = #entry
    if size == 0 or size < 1 + string.byte(entry, 1) % 64 then return end  -- no job id to read
    local job = entry_job(entry, 1)
    if job_exists(job) then job_add(job, 'errors/dead_letter/malformed', 1) end
end
