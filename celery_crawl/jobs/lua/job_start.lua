-- Create a job and enqueue its seed requests, unless the job already exists.
-- Jobs are idempotent by id: a redelivered job task joins the running job.
--
-- KEYS[1..6]  as in enqueue.lua (levels, signal, dupefilter, count, inflight, job prefix)
-- KEYS[7..]  two per other spider of the group: its dupefilter key and count (the job's
--          requests routed there meet that filter: the crawl starts in it too)
-- ARGV[1]  job id
-- ARGV[2]  number of seed requests n
-- ARGV[3]  number of job fields f
-- ARGV[4]  dedup scope: 'job' or 'spider' (as in enqueue.lua)
-- then n groups: priority, fingerprint, job id, payload, lane 0, site (as in enqueue.lua)
-- then f pairs: field, value (spider, seeds, priority, source, ...); with the spider
--          dedup scope, a job with a source starts a crawl of it in the filter
--          (dedup_crawl_start: a kind that counts a source's crawls counts it), in
--          the filter of every spider of the group
-- then the dupefilter's parameters, if it takes any (DEDUP_ARGV: see its fragment)
-- Returns  {1, accepted seeds} for a new job, {0, 0} when it already existed; an
--          error naming the key, and nothing written, when a key it would write is
--          damaged (include/keytypes.lua)
-- Slot     dupefilter: the configured filter's fragment, that of its kind in
--          celery_crawl.dupefilter.filters.KINDS (it defines the dedup_* functions; every
--          spider of a group has the same kind)

local DEDUP_KEY, COUNT_KEY, JOB_PREFIX = KEYS[3], KEYS[4], KEYS[6]
local job, n, f, SCOPE = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
--!include entry_args
local DEDUP_ARGV = 5 + ENTRY_WIDTH * n + 2 * f
--!slot dupefilter
--!include jobs
--!include push

local key = JOB_PREFIX .. job
if redis.call('EXISTS', key) == 1 then return {0, 0} end

local fields_at = 5 + ENTRY_WIDTH * n
for i = fields_at, fields_at + 2 * f - 1, 2 do
    if ARGV[i] == 'source' then JOB_SOURCES[job] = ARGV[i + 1] end  -- before its hash exists
end

local lanes = {[0] = {KEYS[1], KEYS[2], KEYS[3], KEYS[4]}}
local filters = {{KEYS[3], KEYS[4]}}  -- where the job's crawl starts: every filter of the group
for i = 7, #KEYS, 2 do filters[#filters + 1] = {KEYS[i], KEYS[i + 1]} end
local spec = {}  -- every key it writes checked first (include/keytypes.lua)
job_guard(spec, job)
push_guard(spec, lanes, ARGV, 5, n)
if SCOPE == 'spider' then  -- the keys dedup_crawl_start writes, whatever the seeds
    for _, filter in ipairs(filters) do
        dedup_use(filter[1], filter[2])
        dedup_source(job_source(job))
        dedup_crawl_guard(spec)
    end
    dedup_use(KEYS[3], KEYS[4])
end
local refused = refuse_damaged(spec)
if refused then return refused end

local now = redis.call('TIME')
redis.call('HSET', key, 'state', 'running', 'pending', 0, 'leased', 0, 'done', 0,
    'created_at', now[1] + now[2] / 1000000)
job_phase(job, 'queued')
for i = fields_at, fields_at + 2 * f - 1, 2 do
    redis.call('HSET', key, ARGV[i], ARGV[i + 1])
end
if SCOPE == 'spider' then
    for _, filter in ipairs(filters) do
        dedup_use(filter[1], filter[2])
        dedup_crawl_start(job_source(job))
    end
    dedup_use(KEYS[3], KEYS[4])
end
local accepted, count = push_requests(lanes, ARGV, 5, n), 0
for _, flag in ipairs(accepted) do count = count + flag end
job_finish_if_done(job)
return {1, count}
