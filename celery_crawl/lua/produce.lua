-- One producer tick: reserve the sources (e.g. forums) to start jobs for,
-- round-robin from a cursor, under a cap on jobs and on the queue length.
-- Atomic, so two producers running at once never start the same source twice.
--
-- KEYS[1]  running: hash of source -> "job id|reserved at (unix s)", for jobs
--          produced and not finished
-- KEYS[2]  cursor: index into the source list where the next tick starts
-- KEYS[3]  stats hash: producer/produced, producer/held_back, producer/skipped_running
-- KEYS[4]  job key prefix: a job's hash is KEYS[4] .. job id
-- ARGV[1]  job cap: most jobs produced and not finished at once
-- ARGV[2]  queue length now (read by the caller)
-- ARGV[3]  queue cap: produce nothing while the queue is at least this long
-- ARGV[4]  number of sources n
-- ARGV[5 .. 4+n]        the sources, in a stable order
-- ARGV[5+n .. 4+2n]     a fresh job id for each source, used if it is reserved
-- Returns  a flat list: source, job id, source, job id, ... of the reservations
--
-- Damage heals here: a reservation that cannot be read is forgotten, a cursor or
-- a count that is not a number starts from 0.

local running, cursor_key, stats, job_prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local job_cap, queued, queue_cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n = tonumber(ARGV[4])

--!include counters

local START_GRACE = 120  -- seconds a reservation may wait for its job to be created

-- forget jobs that finished (or never started) since the last tick
local now = tonumber(redis.call('TIME')[1])
local entries = redis.call('HGETALL', running)
for i = 1, #entries, 2 do
    local job, at = string.match(entries[i + 1], '^(.*)|(%d+)$')
    local state = redis.call('HGET', job_prefix .. (job or ''), 'state')
    local stale = state == false and now - tonumber(at or 0) > START_GRACE
    if stale or (state ~= false and state ~= 'running') then
        redis.call('HDEL', running, entries[i])
    end
end

local room = job_cap - redis.call('HLEN', running)
if queued >= queue_cap then room = 0 end
local start = (tonumber(redis.call('GET', cursor_key) or '0') or 0) % math.max(n, 1)  -- damaged: 0
local reserved, skipped, looked = {}, 0, 0
for step = 0, n - 1 do
    if room <= 0 then break end
    local index = (start + step) % n
    local source = ARGV[5 + index]
    looked = step + 1
    if redis.call('HEXISTS', running, source) == 1 then
        skipped = skipped + 1
    else
        local job = ARGV[5 + n + index]
        redis.call('HSET', running, source, job .. '|' .. now)
        reserved[#reserved + 1] = source
        reserved[#reserved + 1] = job
        room = room - 1
    end
end
redis.call('SET', cursor_key, (start + looked) % math.max(n, 1))
local produced = #reserved / 2
count(stats, 'producer/produced', produced)  -- a damaged count starts afresh
count(stats, 'producer/skipped_running', skipped)
count(stats, 'producer/held_back', n - produced - skipped)
return reserved
