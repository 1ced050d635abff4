-- Cancel a job: mark it, and purge its queued requests from every level of
-- every queue it spans (the queues of its spider group).
-- Requests of the job already in flight finish normally; their children are
-- refused because the job no longer runs. Other jobs' requests are untouched.
-- Under the spider dedup scope, the fingerprints the purged requests carry
-- (entry_fp, include/jobs.lua) leave their spider's filter, so a later job
-- can crawl those URLs; a bloom filter cannot forget one (dedup_remove).
--
-- KEYS[1]  job key prefix: a job's hash is KEYS[1] .. job id
-- KEYS[2..] three per queue: its levels (sorted set of priority levels), its
--          spider's dupefilter key and dupefilter count
-- ARGV[1]  job id
-- then     the dupefilter's parameters (DEDUP_ARGV: see the dupefilter's fragment)
-- Returns  the number of queued requests purged, or -1 if the job is not running;
--          the job's field unfiltered counts the fingerprints taken out
-- Slot     dupefilter: the configured filter's fragment (every spider of a group
--          has the same kind)
--
-- Cost: one pass over the queued requests (LRANGE of every level), parked ones included.

local JOB_PREFIX = KEYS[1]
local DEDUP_KEY, COUNT_KEY = KEYS[3], KEYS[4]
local DEDUP_ARGV = 2
--!include jobs
--!slot dupefilter

local job = ARGV[1]
local key = JOB_PREFIX .. job
if redis.call('HGET', key, 'state') ~= 'running' then return -1 end
redis.call('HSET', key, 'state', 'cancelled')
redis.call('DEL', key .. ':seen')  -- the job's own dedup set, if it has one
job_phase(job, 'cancelled')

local unfiltered = 0

local function forget(entry)
    local fp = entry_fp(entry, 1)
    if fp and dedup_remove(fp) then unfiltered = unfiltered + 1 end
end

local function purge(levels)
    local purged = 0
    for _, level in ipairs(redis.call('ZRANGE', levels, 0, -1)) do
        local list = levels .. ':' .. level
        local kept, removed = {}, 0
        for _, entry in ipairs(redis.call('LRANGE', list, 0, -1)) do
            if entry_job(entry, 1) == job then
                removed = removed + 1
                forget(entry)
            else
                kept[#kept + 1] = entry
            end
        end
        purged = purged + removed
        if #kept == 0 then
            redis.call('DEL', list)
            redis.call('ZREM', levels, level)
        elseif removed > 0 then
            redis.call('DEL', list)
            for i = 1, #kept, 1000 do
                redis.call('RPUSH', list, unpack(kept, i, math.min(i + 999, #kept)))
            end
        end
    end
    return purged
end

local purged = 0
for i = 2, #KEYS, 3 do
    dedup_use(KEYS[i + 1], KEYS[i + 2])
    purged = purged + purge(KEYS[i])
    for _, site in ipairs(redis.call('ZRANGE', KEYS[i] .. ':parked', 0, -1)) do  -- sites.lua
        local q = site_parked_key(KEYS[i], site)
        purged = purged + purge(q)
        if redis.call('EXISTS', q) == 0 then site_parked_none(site_prefix(JOB_PREFIX), KEYS[i], site) end
    end
end
redis.call('HINCRBY', key, 'pending', -purged)
redis.call('HINCRBY', key, 'purged', purged)
if unfiltered > 0 then redis.call('HINCRBY', key, 'unfiltered', unfiltered) end
job_finish_if_done(job)
return purged
