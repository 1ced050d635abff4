-- How many participants of a job are still working on it, after dropping the
-- ones whose process died: their scheduler registration (the sorted set of open
-- schedulers it names, score = deadline in ms) lapsed or is gone.
--
-- KEYS[1]  job key prefix: a job's hash is KEYS[1] .. job id
-- ARGV[1]  job id
-- Returns  the number of live participants
--          (an error naming the key, nothing written, when a key it writes is damaged:
--          include/keytypes.lua)

--!include keytypes
local JOB_PREFIX = KEYS[1]
--!generated celery_crawl.core.keys:lua_job_keys
local participants = job_participants_key(ARGV[1])
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local refused = refuse_damaged({participants, 'hash'})  -- include/keytypes.lua
if refused then return refused end
local found = redis.call('HGETALL', participants)
for i = 1, #found, 2 do
    -- pcall: a registration key of another type registers nobody
    local deadline = tonumber(redis.pcall('ZSCORE', found[i + 1], found[i]))
    if not deadline or deadline < now_ms then
        redis.call('HDEL', participants, found[i])
    end
end
return redis.call('HLEN', participants)
