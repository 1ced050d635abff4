-- Add a source to a spider's schedule, or change it (celery_crawl.producer.schedule).
--
-- KEYS[1..5]  the schedule's keys (include/schedule.lua): sources, due, paused,
--          intervals, running
-- ARGV[1]  source id
-- ARGV[2]  its definition, JSON
-- ARGV[3]  its interval (s)
-- ARGV[4]  paused: "1" pause it, "0" resume it, "" leave it as it was (a new one: not paused)
-- ARGV[5]  splay: seconds from now that a new source is first due (0: now)
-- Returns  1 for a new source, 0 for a changed one, 2 for one unchanged
--
-- A new source is due now, or splay seconds from now. A changed one keeps its due time, or comes sooner to
-- be due one new interval from now; its current interval (an adaptive source's
-- moves) starts again from the new one only if its interval changed. A paused one
-- is not due; a source whose job still runs is not either: its next due time is
-- set when its job ends.

local id, definition, interval, pause = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local splay = tonumber(ARGV[5]) or 0

--!include schedule
local spec = {}  -- every key it reads or writes checked first (include/keytypes.lua)
schedule_guard(spec)
local refused = refuse_damaged(spec)
if refused then return refused end

local old = redis.call('HGET', sources, id)
local outcome = old and (old == definition and 2 or 0) or 1
local ok, before = pcall(cjson.decode, old or '')
local same_interval = ok and type(before) == 'table' and tonumber(before.interval) == interval
if not (same_interval and redis.call('HEXISTS', intervals, id) == 1) then
    redis.call('HSET', intervals, id, interval)
end
redis.call('HSET', sources, id, definition)
if pause == '1' then
    redis.call('SADD', paused, id)
    redis.call('ZREM', due, id)
    return outcome
end
if pause == '0' then
    redis.call('SREM', paused, id)
elseif redis.call('SISMEMBER', paused, id) == 1 then
    return outcome
end
if redis.call('HEXISTS', running, id) == 1 then return outcome end
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
if outcome == 1 then
    redis.call('ZADD', due, now_ms + math.floor(splay * 1000), id)
elseif not redis.call('ZSCORE', due, id) then
    redis.call('ZADD', due, now_ms, id)
else
    redis.call('ZADD', due, 'LT', now_ms + interval * 1000, id)
end
return outcome
