-- A spider's schedule: the keys every schedule_*.lua script, and produce.lua, holds
-- first, in one order, and their types. Included, never run alone.
--
-- Uses: KEYS[1..5] of the including script, as
-- celery_crawl.producer.schedule.schedule_keys gives them:
--   KEYS[1]  sources: hash of source id -> its definition, JSON
--   KEYS[2]  due: sorted set of the sources waiting for a job, scored by due time (ms)
--   KEYS[3]  paused: set of the paused sources
--   KEYS[4]  intervals: hash of source id -> its current interval (s)
--   KEYS[5]  running: the producer's hash of source -> "job id|reserved at (unix s)"
-- Defines: sources, due, paused, intervals, running (those keys); SCHEDULE_KEYS, the
-- number of them (the including script's own keys follow); schedule_guard(spec): each
-- added to spec with its type (include/keytypes.lua)

--!include keytypes

local sources, due, paused, intervals, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local SCHEDULE_KEYS = 5

local function schedule_guard(spec)
    spec_add(spec, sources, 'hash')
    spec_add(spec, due, 'zset')
    spec_add(spec, paused, 'set')
    spec_add(spec, intervals, 'hash')
    spec_add(spec, running, 'hash')
end
