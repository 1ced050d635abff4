-- Give back a source's reservation whose job could not be started
-- (celery_crawl.producer.schedule): the source is due now again, unless it was
-- paused or removed since.
--
-- KEYS[1..5]  the schedule's keys (include/schedule.lua): sources, due, paused,
--          intervals, running
-- ARGV[1]  source id
-- Returns  1 if the source is due again, 0 if not

local id = ARGV[1]

--!include schedule
local spec = {}  -- the schedule's keys checked first, as every schedule script does
schedule_guard(spec)
local refused = refuse_damaged(spec)
if refused then return refused end

redis.call('HDEL', running, id)
if redis.call('HEXISTS', sources, id) == 0 or redis.call('SISMEMBER', paused, id) == 1 then
    return 0
end
local now = redis.call('TIME')
redis.call('ZADD', due, 'NX', now[1] * 1000 + math.floor(now[2] / 1000), id)
return 1
