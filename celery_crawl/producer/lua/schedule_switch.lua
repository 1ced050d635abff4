-- Pause a source of a spider's schedule, or resume it (celery_crawl.producer.schedule).
--
-- KEYS[1..5]  the schedule's keys (include/schedule.lua): sources, due, paused,
--          intervals, running
-- ARGV[1]  source id
-- ARGV[2]  "1": pause, "0": resume
-- Returns  0: no such source; 1: done
--
-- Paused, a source is not due: a job of it that runs goes on, and no next one is
-- produced. Resumed, it is due now, or when its running job ends.

local id, pause = ARGV[1], ARGV[2] == '1'

--!include schedule
local spec = {}  -- the schedule's keys checked first, as every schedule script does
schedule_guard(spec)
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
