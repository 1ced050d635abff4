-- Put leased requests back at the front of their priority level.
--
-- KEYS[1]  queue levels: sorted set of priority levels, score = -priority
-- KEYS[2]  in-flight leases: sorted set, score = lease deadline (ms)
-- KEYS[3]  signal list, woken once per requeued request (capped)
-- KEYS[4]  job key prefix: a job's hash is KEYS[4] .. job id
-- KEYS[5]  dead-letter list, KEYS[6] the spider's stats hash: for poison (include/poison.lua)
-- KEYS[7]  lease counter: out of memory, the call is refused before its first write
--          (include/room.lua), and the leases stay in flight for their holders to renew
-- KEYS[8]  the group's site prefix (include/sites.lua): sites' keys are derived from it
-- ARGV[1]  pop side: 'head' or 'tail', the end of a level list that pops read from
-- ARGV[2]  the most expired leases to requeue in this call (expiry uses the server's clock)
-- ARGV[3]  the most records the dead-letter list keeps
-- ARGV[4..] explicit lease members to hand back now; when given, expiry is ignored
-- Returns  the number of requests requeued
--
-- A member already acked (no longer in KEYS[2]) is left alone, so a late
-- hand-back can never duplicate a finished request. A request of a job that
-- no longer runs (cancelled) is finished instead of requeued. A lease counted
-- against its site's cap gives the site its slot back (include/sites.lua). A member
-- that cannot be read (too short for a lease header, or an entry with a broken
-- header) is poison: taken out and dead-lettered, never put back; so is one of an
-- unknown job (no job hash, or one of the wrong type), as lease.lua does.
--
-- The keys it writes, the lists it pushes into among them, are checked before the first
-- write (include/keytypes.lua): while one has the wrong type the call is refused whole,
-- and the leases stay in flight until the caller's repair lets it through.

local JOB_PREFIX = KEYS[4]
local QUEUE, DEADLETTER, STATS, DEADLETTER_MAX = KEYS[1], KEYS[5], KEYS[6], tonumber(ARGV[3])
--!include jobs
--!include poison
--!include keytypes
--!include room

local levels, inflight = KEYS[1], KEYS[2]
local push = ARGV[1] == 'tail' and 'RPUSH' or 'LPUSH'
local members = {}
if #ARGV > 3 then
    for i = 4, #ARGV do members[#members + 1] = ARGV[i] end
else
    local now = redis.call('TIME')
    local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
    members = redis.call('ZRANGE', inflight, '-inf', '(' .. now_ms, 'BYSCORE', 'LIMIT', 0, ARGV[2])
end
if #members == 0 then return 0 end  -- the common case: a heartbeat that finds none expired

local guard = {levels, 'zset', inflight, 'zset', KEYS[3], 'list', DEADLETTER, 'list',
    STATS, 'hash', JOB_STATES_KEY, 'hash', ACTIVE_JOBS_KEY, 'set',
    KEYS[7], 'counter'}
for _, member in ipairs(members) do
    if #member >= 13 and not entry_problem(string.sub(member, 13)) then
        local into = site_front(levels, member)
        guard[#guard + 1] = into
        guard[#guard + 1] = 'zset'
        guard[#guard + 1] = level_key(into, struct.unpack('>i4', member, 9))
        guard[#guard + 1] = 'list'
    end
end
local refused = refuse_damaged(guard)
if refused then return refused end
refuse_when_full(KEYS[7])

local requeued = 0
for _, member in ipairs(members) do
    local entry = string.sub(member, 13)
    local broken = #member < 13 and 'a lease shorter than its header' or entry_problem(entry)
    if broken and redis.call('ZREM', inflight, member) == 1 then
        poison(#member < 13 and member or entry, broken, 'requeue')
    elseif redis.call('ZREM', inflight, member) == 1 then
        site_release(KEYS[8], levels, member)
        local job = entry_job(member, 13)
        if job_running(job) then
            local priority = struct.unpack('>i4', member, 9)
            local into = site_front(levels, member)  -- its site's parked entries wait: before them
            redis.call(push, level_key(into, priority), string.sub(member, 13))
            redis.call('ZADD', into, 'NX', -priority, priority)
            job_add(job, 'leased', -1)
            requeued = requeued + 1
        elseif job_exists(job) then
            job_ack(job)  -- its job ended: discarded
        else
            poison(entry, 'an unknown job', 'requeue')  -- as lease.lua: never dropped uncounted
        end
    end
end
for _ = 1, math.min(requeued, 64) do
    redis.call('RPUSH', KEYS[3], 1)
end
redis.call('LTRIM', KEYS[3], -64, -1)
if requeued > 0 then redis.pcall('PUBLISH', KEYS[3], requeued) end
return requeued
