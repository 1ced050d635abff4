-- Bring a spider's schedule back to one truth after a repair moved one of its keys
-- aside (celery_crawl.producer.schedule): the sources hash is the truth.
--
-- KEYS[1..5]  the schedule's keys (include/schedule.lua): sources, due, paused,
--          intervals, running
-- ARGV     none
-- Returns  {sources made due, entries dropped}
--
-- A source that is neither due, nor paused, nor running (its due entry was lost with
-- a damaged key) is due now; due, paused and interval entries of sources that are
-- gone are dropped. It reads every source: run after a repair, not at every tick.

--!include schedule
local spec = {}  -- every key it reads or writes checked first (include/keytypes.lua)
schedule_guard(spec)
local refused = refuse_damaged(spec)
if refused then return refused end

local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local made_due, dropped = 0, 0
for _, id in ipairs(redis.call('HKEYS', sources)) do
    local waiting = redis.call('ZSCORE', due, id)
    if not waiting and redis.call('SISMEMBER', paused, id) == 0
            and redis.call('HEXISTS', running, id) == 0 then
        redis.call('ZADD', due, now, id)
        made_due = made_due + 1
    end
end
local function drop_gone(members, remove, key)
    for _, id in ipairs(members) do
        if redis.call('HEXISTS', sources, id) == 0 then
            redis.call(remove, key, id)
            dropped = dropped + 1
        end
    end
end
drop_gone(redis.call('ZRANGE', due, 0, -1), 'ZREM', due)
drop_gone(redis.call('SMEMBERS', paused), 'SREM', paused)
drop_gone(redis.call('HKEYS', intervals), 'HDEL', intervals)
return {made_due, dropped}
