-- Cancel a job: mark it, and purge its queued requests from every level of
-- every queue it spans (the queues of its spider group).
-- Requests of the job already in flight finish normally; their children are
-- refused because the job no longer runs. Other jobs' requests are untouched.
-- Under the spider dedup scope, the fingerprints the purged requests carry
-- (entry_fp, include/entries.lua) leave their spider's filter, so a later job
-- can crawl those URLs, unless its kind cannot forget one (its dedup_remove).
--
-- KEYS[1]  job key prefix: a job's hash is KEYS[1] .. job id
-- KEYS[2]  the group's site prefix (include/sites.lua): sites' keys are derived from it
-- KEYS[3..] three per queue: its levels (sorted set of priority levels), its
--          spider's dupefilter key and dupefilter count
-- ARGV[1]  job id
-- then     the dupefilter's parameters (DEDUP_ARGV: see the dupefilter's fragment)
-- Returns  the number of queued requests purged, or -1 if the job is not running (a
--          job hash of another type is no job); the job's field unfiltered counts the
--          fingerprints taken out. An error naming the key, nothing written, when a key
--          it reads or writes is damaged (include/keytypes.lua): every queue key of
--          every spider it spans, their filters' keys the purged fingerprints meet, the
--          job's bookkeeping. Its counters heal (include/counters.lua).
-- Slot     dupefilter: the configured filter's fragment, that of its kind in
--          celery_crawl.dupefilter.filters.KINDS (every spider of a group has the same kind)
--
-- Cost: one pass over the queued requests (LRANGE of every level), parked ones included;
-- one TYPE a key it may write. The lists are read (and the job's fingerprints found)
-- before the checks of the filters' keys, and written after every check: a list that
-- holds entries of the job and of others is read twice.

local JOB_PREFIX = KEYS[1]
local DEDUP_KEY, COUNT_KEY = KEYS[4], KEYS[5]
local DEDUP_ARGV = 2
--!include jobs
--!include levels
--!slot dupefilter

local job = ARGV[1]
local key = JOB_PREFIX .. job
if not job_exists(job) or redis.call('HGET', key, 'state') ~= 'running' then return -1 end
local sites = KEYS[2]

local spec = {}  -- the queues' keys and the job's: checked before anything is read from them
job_guard(spec, job)
for i = 3, #KEYS, 3 do queue_guard(spec, KEYS[i], sites) end
local refused = refuse_damaged(spec)
if refused then return refused end

-- How many entries of the job a list holds, of how many; the fingerprints to forget.
-- (Its entries are not kept: a list is read again when it is rewritten, one at a time.)
local function plan_list(levels, level, plans, fps)
    local list = level_key(levels, level)
    local entries, removed = redis.call('LRANGE', list, 0, -1), 0
    for _, entry in ipairs(entries) do
        if entry_job(entry, 1) == job then
            removed = removed + 1
            local fp = entry_fp(entry, 1)
            if fp then fps[#fps + 1] = fp end
        end
    end
    plans[#plans + 1] = {levels = levels, level = level, list = list, removed = removed,
        all = removed == #entries}
end

local function plan_levels(levels, plans, fps)
    for _, level in ipairs(redis.call('ZRANGE', levels, 0, -1)) do
        plan_list(levels, level, plans, fps)
    end
end

local spans = {}  -- per queue: its dedup keys, its lists' plans, the parked sites' queues
for i = 3, #KEYS, 3 do
    local span = {levels = KEYS[i], dedup = KEYS[i + 1], count = KEYS[i + 2], plans = {}, fps = {}}
    span.parked = redis.call('ZRANGE', parked_key(KEYS[i]), 0, -1)  -- sites.lua
    plan_levels(KEYS[i], span.plans, span.fps)
    for _, site in ipairs(span.parked) do
        plan_levels(site_parked_key(KEYS[i], site), span.plans, span.fps)
    end
    dedup_use(span.dedup, span.count)
    dedup_source(job_source(job))  -- the fingerprints are the job's: its source's
    dedup_guard(spec, span.fps)  -- the filter's keys dedup_remove meets
    spans[#spans + 1] = span
end
refused = refuse_damaged(spec)
if refused then return refused end

redis.call('HSET', key, 'state', 'cancelled')
redis.call('DEL', job_seen_key(job))  -- the job's own dedup set, if it has one
job_phase(job, 'cancelled')

local unfiltered, purged = 0, 0
local function apply(plan)
    purged = purged + plan.removed
    if plan.all then  -- nothing else there (or an empty level the index still names)
        redis.call('DEL', plan.list)
        redis.call('ZREM', plan.levels, plan.level)
    elseif plan.removed > 0 then
        local kept = {}
        for _, entry in ipairs(redis.call('LRANGE', plan.list, 0, -1)) do
            if entry_job(entry, 1) ~= job then kept[#kept + 1] = entry end
        end
        redis.call('DEL', plan.list)
        for i = 1, #kept, 1000 do
            redis.call('RPUSH', plan.list, unpack(kept, i, math.min(i + 999, #kept)))
        end
    end
end

for _, span in ipairs(spans) do
    dedup_use(span.dedup, span.count)
    dedup_source(job_source(job))
    for _, fp in ipairs(span.fps) do
        if dedup_remove(fp) then unfiltered = unfiltered + 1 end
    end
    for _, plan in ipairs(span.plans) do apply(plan) end
    for _, site in ipairs(span.parked) do
        if redis.call('EXISTS', site_parked_key(span.levels, site)) == 0 then
            site_parked_none(sites, span.levels, site)
        end
    end
end
count(key, 'pending', -purged)  -- a counter of text heals (include/counters.lua)
count(key, 'purged', purged)
if unfiltered > 0 then count(key, 'unfiltered', unfiltered) end
job_finish_if_done(job)
return purged
