-- What Job.wait looks at, in one round trip: the job's hash, the server's clock, and
-- how many participants are still working on the job. Once the job has ended, the
-- participants whose process died are dropped first: their scheduler registration
-- (the sorted set of open schedulers it names, score = deadline in ms) lapsed or is gone.
--
-- KEYS[1]  job key prefix: a job's hash is KEYS[1] .. job id
-- ARGV[1]  job id
-- Returns  {the number of participants, the job hash's fields and values, flat; TIME's reply}
--          (an error naming the key, nothing written, when a key it writes is damaged:
--          include/keytypes.lua; a job key of another type makes HGETALL fail with
--          WRONGTYPE, which the caller reports)

--!include keytypes
local JOB_PREFIX = KEYS[1]
--!generated celery_crawl.core.keys:lua_job_keys
--!generated celery_crawl.jobs.store:lua_tables
local participants = job_participants_key(ARGV[1])
local refused = refuse_damaged({participants, 'hash'})  -- include/keytypes.lua
if refused then return refused end
local now = redis.call('TIME')
local job = redis.call('HGETALL', JOB_PREFIX .. ARGV[1])
local state
for i = 1, #job, 2 do
    if job[i] == 'state' then state = job[i + 1] end
end
if FINAL[state] then
    local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
    local found = redis.call('HGETALL', participants)
    for i = 1, #found, 2 do
        -- pcall: a registration key of another type registers nobody
        local deadline = tonumber(redis.pcall('ZSCORE', found[i + 1], found[i]))
        if not deadline or deadline < now_ms then
            redis.call('HDEL', participants, found[i])
        end
    end
end
return {redis.call('HLEN', participants), job, now}
