-- A process starts working on a job: it joins the job's participants, and
-- reads what it needs to run the job's requests, in one step.
--
-- KEYS[1]  job key prefix: a job's hash is KEYS[1] .. job id
-- ARGV[1]  job id
-- ARGV[2]  the joining scheduler's id ('': only read, do not join)
-- ARGV[3]  the key of its registration (the open schedulers of its queue):
--          a participant whose registration lapsed is dropped by jobs/lua/job_settle.lua
-- Returns  {state, spider arguments (JSON), depth limit}, '' where the job has
--          (an error naming the key, nothing written, when a key it writes is damaged:
--          include/keytypes.lua)
--          none; the process joins only while the job runs
--
-- A job that no longer runs (closed, cancelled) is not joined: the request the
-- process leased before the job ended is discarded, as queue/lua/lease.lua does.

local JOB_PREFIX = KEYS[1]
--!include jobs

local job = ARGV[1]
local key = JOB_PREFIX .. job
local fields = redis.pcall('HMGET', key, 'state', 'args', 'limit/depth')
if fields['err'] then return {'', '', ''} end  -- a job hash of the wrong type: no job
if fields[1] == 'running' and ARGV[2] ~= '' then
    local refused = refuse_damaged({job_participants_key(job), 'hash'})
    if refused then return refused end
    redis.call('HSET', job_participants_key(job), ARGV[2], ARGV[3])
    redis.call('EXPIRE', job_participants_key(job), JOB_TTL)
end
return {fields[1] or '', fields[2] or '', fields[3] or ''}
