-- Give back a source's reservation whose job could not be started
-- (celery_crawl.producer.schedule): the source is due now again, unless it was
-- paused or removed since.
--
-- KEYS[1]  sources: hash of source id -> its definition, JSON
-- KEYS[2]  due: sorted set of the sources waiting for a job, scored by due time (ms)
-- KEYS[3]  paused: set of the paused sources
-- KEYS[4]  running: the producer's hash of source -> "job id|reserved at (unix s)"
-- ARGV[1]  source id
-- Returns  1 if the source is due again, 0 if not

local sources, due, paused, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]

--!include keytypes
local spec = {}  -- every key it reads or writes checked first (include/keytypes.lua)
spec_add(spec, sources, 'hash')
spec_add(spec, due, 'zset')
spec_add(spec, paused, 'set')
spec_add(spec, running, 'hash')
local refused = refuse_damaged(spec)
if refused then return refused end

redis.call('HDEL', running, id)
if redis.call('HEXISTS', sources, id) == 0 or redis.call('SISMEMBER', paused, id) == 1 then
    return 0
end
local now = redis.call('TIME')
redis.call('ZADD', due, 'NX', now[1] * 1000 + math.floor(now[2] / 1000), id)
return 1
