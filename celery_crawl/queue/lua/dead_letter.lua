-- A leased entry that cannot become a request (the codec refused it): out of the
-- in-flight set for good, with its record on the dead-letter list, in one step.
--
-- KEYS[1]  in-flight leases: sorted set, score = lease deadline (ms)
-- KEYS[2]  job key prefix: a job's hash is KEYS[2] .. job id
-- KEYS[3]  dead-letter list: newest first
-- KEYS[4]  queue levels: sorted set of priority levels (its sites' leases name it)
-- KEYS[5]  the group's site prefix (include/sites.lua): sites' keys are derived from it
-- ARGV[1]  the lease member
-- ARGV[2]  the record (JSON text)
-- ARGV[3]  the most records the list keeps
-- ARGV[4]  the field the job counts it in (errors/dead_letter/<reason>)
-- Returns  1 if the lease was held (then it is recorded), 0 if not; an error naming
--          the key, and nothing written, when a key it would write is damaged
--
-- The job's pending count is left as it is: an entry that could not be read may
-- never have been counted (written into the queue by something else), and a
-- job must never end while requests of it are still queued. A job that did
-- count it ends incomplete, with it in errors/lost, once its queues are empty
-- (jobs/lua/job_reconcile.lua). Its leased count goes back down, as the lease ends.

local JOB_PREFIX = KEYS[2]
--!include jobs

local member = ARGV[1]
local spec = {KEYS[3], 'list'}  -- every key it writes checked first (include/keytypes.lua)
ack_guard(spec, KEYS[1], KEYS[5], ARGV, 1, 1)
local refused = refuse_damaged(spec)
if refused then return refused end
if redis.call('ZREM', KEYS[1], member) == 0 then return 0 end
redis.call('LPUSH', KEYS[3], ARGV[2])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[3]) - 1)
site_release(KEYS[5], KEYS[4], member)
local size = #member - 12
if size > 0 and size >= 1 + string.byte(member, 13) % 64 then
    local job = entry_job(member, 13)
    if job_exists(job) then
        job_add(job, ARGV[4], 1)
        job_add(job, 'leased', -1)
    end
end
return 1
