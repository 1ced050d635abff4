-- One producer tick: reserve the sources (e.g. forums) to start jobs for,
-- round-robin from a cursor, under a cap on jobs and on the queue length.
-- Atomic, so two producers running at once never start the same source twice.
-- The queue length counts every spider of the group (all in one hash tag): a
-- job's detail requests wait in another spider's queue than its seeds.
--
-- KEYS[1..5]  the spider's schedule's keys (include/schedule.lua): sources, due, paused,
--          intervals, and running, the hash of source -> "job id|reserved at (unix s)"
--          of the jobs produced and not finished
-- KEYS[6]  cursor: index into the source list where the next tick starts
-- KEYS[7]  stats hash: producer/produced, producer/held_back, producer/skipped_running
-- KEYS[8]  job key prefix: a job's hash is KEYS[8] .. job id
-- KEYS[9 ..]  the queue levels (sorted set of priority levels) of each spider of the group
-- ARGV[1]  job cap: most jobs produced and not finished at once
-- ARGV[2]  queue cap: produce nothing while the group's queues hold at least this many
-- ARGV[3]  number of sources n
-- then n sources, in a stable order (ARGV[4 .. 3+n])
-- then n fresh job ids, one for each source, used if it is reserved (ARGV[4+n .. 3+2n])
-- Returns  a flat list: the group's queue length, then source, job id, source,
--          job id, ... of the reservations
--
-- The running hash is the schedule's too: a spider whose schedule is emptied runs
-- this tick, and a source put on the schedule again while its job ran must not be
-- forgotten with it. A finished job's source that is on the schedule (and not
-- paused) is made due now, as schedule_tick.lua would, so the schedule takes it up.
--
-- Damage heals here: a reservation that cannot be read is forgotten (its job's
-- hash of another type too: no job), a cursor or a count that is not a number
-- starts from 0. A key of another type, the group's queues' included, is refused
-- before the first write, named (include/keytypes.lua): the caller repairs it
-- with its spider and calls again.

local job_cap, queue_cap, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

--!include schedule
--!include counters
--!include levels

local cursor_key, stats = KEYS[SCHEDULE_KEYS + 1], KEYS[SCHEDULE_KEYS + 2]
local job_prefix, LEVELS = KEYS[SCHEDULE_KEYS + 3], SCHEDULE_KEYS + 4
local spec = {}  -- the schedule's keys, and every other key it reads or writes, checked first
schedule_guard(spec)
spec_add(spec, cursor_key, 'string')
spec_add(spec, stats, 'hash')
for i = LEVELS, #KEYS do queue_guard(spec, KEYS[i], nil) end
local refused = refuse_damaged(spec)
if refused then return refused end

local queued = 0
for i = LEVELS, #KEYS do
    queued = queued + queue_length(KEYS[i])
end

-- START_GRACE: seconds a reservation may wait for its job to be created
--!generated celery_crawl.producer.producer:lua_constants

-- forget jobs that finished (or never started) since the last tick
local now = tonumber(redis.call('TIME')[1])
local entries = redis.call('HGETALL', running)
for i = 1, #entries, 2 do
    local job, at = string.match(entries[i + 1], '^(.*)|(%d+)$')
    local state = redis.pcall('HGET', job_prefix .. (job or ''), 'state')
    if type(state) == 'table' then state = 'damaged' end  -- not a hash: no job (core/lua/repair.lua)
    local stale = state == false and now - tonumber(at or 0) > START_GRACE
    if stale or (state ~= false and state ~= 'running') then
        redis.call('HDEL', running, entries[i])
        if redis.call('HEXISTS', sources, entries[i]) == 1
                and redis.call('SISMEMBER', paused, entries[i]) == 0 then
            local clock = redis.call('TIME')
            redis.call('ZADD', due, 'NX', clock[1] * 1000 + math.floor(clock[2] / 1000), entries[i])
        end
    end
end

local room = job_cap - redis.call('HLEN', running)
if queued >= queue_cap then room = 0 end
local start = (tonumber(redis.call('GET', cursor_key) or '0') or 0) % math.max(n, 1)  -- damaged: 0
local reply, skipped, looked = {queued}, 0, 0  -- reply: the length, then the reservations
for step = 0, n - 1 do
    if room <= 0 then break end
    local index = (start + step) % n
    local source = ARGV[4 + index]
    looked = step + 1
    if redis.call('HEXISTS', running, source) == 1 then
        skipped = skipped + 1
    else
        local job = ARGV[4 + n + index]
        redis.call('HSET', running, source, job .. '|' .. now)
        reply[#reply + 1] = source
        reply[#reply + 1] = job
        room = room - 1
    end
end
redis.call('SET', cursor_key, (start + looked) % math.max(n, 1))
local produced = (#reply - 1) / 2
count(stats, 'producer/produced', produced)  -- a damaged count starts afresh
count(stats, 'producer/skipped_running', skipped)
count(stats, 'producer/held_back', n - produced - skipped)
return reply
