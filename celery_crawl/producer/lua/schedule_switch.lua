-- Pause a source of a spider's schedule, or resume it (celery_crawl.producer.schedule).
--
-- KEYS[1]  sources: hash of source id -> its definition, JSON
-- KEYS[2]  due: sorted set of the sources waiting for a job, scored by due time (ms)
-- KEYS[3]  paused: set of the paused sources
-- KEYS[4]  running: the producer's hash of source -> "job id|reserved at (unix s)"
-- ARGV[1]  source id
-- ARGV[2]  "1": pause, "0": resume
-- Returns  0: no such source; 1: done
--
-- Paused, a source is not due: a job of it that runs goes on, and no next one is
-- produced. Resumed, it is due now, or when its running job ends.

local sources, due, paused, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, pause = ARGV[1], ARGV[2] == '1'

--!include keytypes
local spec = {}  -- every key it reads or writes checked first (include/keytypes.lua)
spec_add(spec, sources, 'hash')
spec_add(spec, due, 'zset')
spec_add(spec, paused, 'set')
spec_add(spec, running, 'hash')
local refused = refuse_damaged(spec)
if refused then return refused end

if redis.call('HEXISTS', sources, id) == 0 then return 0 end
if pause then
    redis.call('SADD', paused, id)
    redis.call('ZREM', due, id)
    return 1
end
redis.call('SREM', paused, id)
if redis.call('HEXISTS', running, id) == 0 then
    local now = redis.call('TIME')
    redis.call('ZADD', due, 'NX', now[1] * 1000 + math.floor(now[2] / 1000), id)
end
return 1
