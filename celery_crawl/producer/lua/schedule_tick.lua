-- One tick of a spider's schedule: the sources that are due, in due order, get a
-- job each, under the producer's caps (celery_crawl.producer.schedule). Atomic, so
-- two producers running at once never start the same source twice. It costs the
-- sources due (and the jobs produced and not finished), not every source.
--
-- KEYS[1..5]  the schedule's keys (include/schedule.lua): sources, due, paused,
--          intervals, running
-- KEYS[6]  stats hash: producer/produced, producer/held_back
-- KEYS[7]  job key prefix: a job's hash is KEYS[7] .. job id
-- KEYS[8 ..]  the queue levels of each spider of the group
-- ARGV[1]  job cap: most jobs produced and not finished at once
-- ARGV[2]  queue cap: produce nothing while the group's queues hold at least this many
-- ARGV[3]  faster: an adaptive source's interval times this after a job with items
-- ARGV[4]  slower: its interval times this after a job without
-- ARGV[5..]  fresh job ids, one per source it may reserve
-- Returns  a flat list: the group's queue length, the sources still due after this
--          tick, the tick's time (unix ms), then source, job id, definition, due
--          time (unix ms) of each reservation
--
-- A source's next due time is set when its job has ended: its last reservation
-- plus its interval (start to start), now if that has passed. An adaptive
-- source's interval first moves, within its bounds: shorter after a job that
-- found items, longer after one that found none. A reservation whose job was never
-- created (START_GRACE) makes its source due again now, its interval unchanged. A
-- source whose definition is not JSON is paused, not reserved, and counted
-- (producer/sources_unreadable): put it again to fix it.

local job_cap, queue_cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local faster, slower = tonumber(ARGV[3]), tonumber(ARGV[4])

--!include schedule
--!include counters
--!include levels

local stats, job_prefix = KEYS[SCHEDULE_KEYS + 1], KEYS[SCHEDULE_KEYS + 2]
local spec = {}  -- every key it reads or writes checked first (include/keytypes.lua)
schedule_guard(spec)
spec_add(spec, stats, 'hash')
for i = SCHEDULE_KEYS + 3, #KEYS do queue_guard(spec, KEYS[i], nil) end
local refused = refuse_damaged(spec)
if refused then return refused end

local queued = 0
for i = SCHEDULE_KEYS + 3, #KEYS do
    queued = queued + queue_length(KEYS[i])
end

-- START_GRACE: seconds a reservation may wait for its job to be created
--!generated celery_crawl.producer.producer:lua_constants
-- MIN_INTERVAL, MAX_INTERVAL: the bounds of every interval (s)
--!generated celery_crawl.producer.schedule:lua_constants
local now = redis.call('TIME')
local now_s, now_ms = tonumber(now[1]), now[1] * 1000 + math.floor(now[2] / 1000)

local function definition_of(source)  -- the decoded definition, or nil if it is not JSON
    local ok, definition = pcall(cjson.decode, redis.call('HGET', sources, source) or '')
    if ok and type(definition) == 'table' then return definition end
    return nil
end

local function bounded(value, low, high)  -- a number within [low, high]; nil if none
    value = tonumber(value)
    if not value or value ~= value then return nil end  -- not a number, or NaN
    return math.min(math.max(value, low), high)
end

local function next_interval(source, job, ran)
    local definition = definition_of(source) or {}
    local interval = bounded(redis.call('HGET', intervals, source), MIN_INTERVAL, MAX_INTERVAL)
    interval = interval or bounded(definition.interval, MIN_INTERVAL, MAX_INTERVAL) or 3600
    if ran and definition.adaptive == true then
        local items = tonumber(redis.pcall('HGET', job_prefix .. job, 'items')) or 0
        local low = bounded(definition.min_interval, MIN_INTERVAL, MAX_INTERVAL) or MIN_INTERVAL
        local high = bounded(definition.max_interval, low, MAX_INTERVAL) or MAX_INTERVAL
        interval = bounded(interval * (items > 0 and faster or slower), low, high)
    end
    redis.call('HSET', intervals, source, interval)
    return interval
end

-- the jobs that ended (or never started) since the last tick: their sources due again
local entries = redis.call('HGETALL', running)
for i = 1, #entries, 2 do
    local source = entries[i]
    local job, at = string.match(entries[i + 1], '^(.*)|(%d+)$')
    local state = redis.pcall('HGET', job_prefix .. (job or ''), 'state')
    if type(state) == 'table' then state = 'damaged' end  -- not a hash: no job (core/lua/repair.lua)
    local stale = state == false and now_s - tonumber(at or 0) > START_GRACE
    if stale or (state ~= false and state ~= 'running') then
        redis.call('HDEL', running, source)
        local scheduled = redis.call('HEXISTS', sources, source) == 1
        if scheduled and redis.call('SISMEMBER', paused, source) == 0 then
            local next_due = now_ms  -- a job never created: due again now, interval unchanged
            if not stale then
                local interval = next_interval(source, job or '', true)
                next_due = math.max((tonumber(at) or now_s) * 1000 + interval * 1000, now_ms)
            end
            redis.call('ZADD', due, next_due, source)
        end
    end
end

local room = math.min(job_cap - redis.call('HLEN', running), #ARGV - 4)
if queued >= queue_cap then room = 0 end
local reply = {queued, 0, now_ms}
if room > 0 then
    local found = redis.call(
        'ZRANGE', due, '-inf', now_ms, 'BYSCORE', 'LIMIT', 0, room, 'WITHSCORES')
    local unreadable = 0
    for index = 1, #found / 2 do
        local source, due_ms = found[2 * index - 1], found[2 * index]
        redis.call('ZREM', due, source)
        local definition = redis.call('HGET', sources, source)
        if definition and not definition_of(source) then
            redis.call('SADD', paused, source)  -- not JSON: paused until put again
            unreadable = unreadable + 1
        elseif definition then
            local job = ARGV[4 + index]
            redis.call('HSET', running, source, job .. '|' .. now_s)
            reply[#reply + 1] = source
            reply[#reply + 1] = job
            reply[#reply + 1] = definition
            reply[#reply + 1] = due_ms
        end
    end
    if unreadable > 0 then count(stats, 'producer/sources_unreadable', unreadable) end
end
local still_due = redis.call('ZCOUNT', due, '-inf', now_ms)
reply[2] = still_due
count(stats, 'producer/produced', (#reply - 3) / 4)  -- a damaged count starts afresh
count(stats, 'producer/held_back', still_due)
return reply
