-- A participant is done with an ended job: its items are through its
-- pipelines, its feeds are closed, job_finished was sent. The last one to
-- leave wakes Job.wait() (jobs/lua/include/jobs.lua).
--
-- KEYS[1]  job key prefix: a job's hash is KEYS[1] .. job id
-- ARGV[1]  job id
-- ARGV[2]  the leaving scheduler's id
-- Returns  the number of participants still working on the job
--          (an error naming the key, nothing written, when a key it writes is damaged:
--          include/keytypes.lua)

local JOB_PREFIX = KEYS[1]
--!include jobs

local job = ARGV[1]
local participants = job_participants_key(job)
local spec = {}  -- every key it writes checked first (include/keytypes.lua)
job_guard(spec, job)
local refused = refuse_damaged(spec)
if refused then return refused end
if redis.call('HDEL', participants, ARGV[2]) == 0 then
    return redis.call('HLEN', participants)
end
local left = redis.call('HLEN', participants)
if left == 0 then job_wake(job) end
return left
