-- Enqueue a batch of requests, each checked against the dedup filter first;
-- add per-job stats; keep the records of requests that could not be queued
-- in the dead-letter list; end the jobs a callback asked to end; then finish
-- (ack) the leases of the requests that produced them. One atomic step, so a
-- crash never leaves a finished parent whose children were not enqueued, or
-- whose dropped children went unrecorded.
--
-- A call may reach Redis twice: its reply lost (Redis stopped, a connection
-- cut) after it ran, the client sends it again. A writer (a scheduler's
-- write-behind buffer) numbers its calls; the number and the flags of its last
-- applied call are kept in KEYS[8], and a call whose number is already there
-- changes nothing and returns those flags: job counters and dead letters are
-- added once.
--
-- KEYS[1]  queue levels: sorted set of priority levels, score = -priority
-- KEYS[2]  signal list: wake-up tokens for blocked pops
-- KEYS[3]  dupefilter key (bucket keys are derived from it)
-- KEYS[4]  dupefilter count
-- KEYS[5]  in-flight leases: sorted set, score = lease deadline (ms)
-- KEYS[6]  job key prefix: a job's hash is KEYS[6] .. job id
-- KEYS[7]  dead-letter list: newest first
-- KEYS[8]  the writer's record: string '<number>:<flags>' of its last applied
--          call (not read or written when ARGV[7] is '')
-- KEYS[9]  the group's site prefix (include/sites.lua): sites' keys are derived from it
-- KEYS[10..] four per other spider of the group whose queue takes requests
--          (the vertical split): its queue levels, signal, dupefilter key and
--          dupefilter count; lane j is KEYS[6 + 4j .. 9 + 4j], lane 0 the own
-- ARGV[1]  number of requests n
-- ARGV[2]  number of job stat changes s
-- ARGV[3]  number of leases to ack m
-- ARGV[4]  number of dead-letter records d
-- ARGV[5]  the most records the dead-letter list keeps
-- ARGV[6]  dedup scope: 'job' (a job's requests are checked against the job's
--          own set) or 'spider' (against the spider's filter)
-- ARGV[7]  the writer's number for this call ('' = none: the call is not recorded)
-- ARGV[8]  milliseconds the writer's record is kept
-- ARGV[9]  the writer's participant id (its scheduler's id, jobs/lua/job_join.lua); '' = none:
--          its job stats are never judged late
-- ARGV[10] number of acked stat changes a (a page's stats, written only with its ack)
-- ARGV[11] number of jobs to end e (a callback raised CloseSpider)
-- then n groups: priority, fingerprint ('' = dont_filter), job id ('' = none),
--          payload, lane (0 = this spider's queue), site ('' = none: no site limits)
-- then s groups: job id, field, delta; a job that has ended (or is gone) takes them as
--          late when the writer is not (or no longer) among its participants: a process
--          cut off whose registration lapsed, dropped by jobs/lua/job_settle.lua, so Job.wait()
--          may have returned. They go to its fields late/<field>, its counters untouched
--          (purged, the count of its requests discarded after its end, is its own). A
--          participant closing its part of the job still adds to its counters.
-- then a groups: lease number i (the i-th lease member below), job id, field, delta: a
--          change that counts only if that lease is still held when the call runs, or its
--          job has ended (then as the job stats above). A lease that lapsed while its job
--          runs (its process cut off or paused) was requeued, and is acked by the fetch
--          that holds it: this one's changes go to the job's fields late/<field>, so the
--          page is counted once.
-- then m lease members to ack
-- then d dead-letter records (JSON text), pushed in order
-- then e groups: job id, reason: each running job ends closed with its reason
--          (include/jobs.lua's job_end), after this call's stats count in it and
--          before its acks, so that the ack of the page whose callback asked never
--          ends it done, and that page's stats meet the lapsed-lease rule above
-- then the dupefilter's parameters, if it takes any (DEDUP_ARGV: see its fragment)
-- Returns  a list of n flags: 1 = enqueued, 0 = duplicate or job no longer running
--          (for a call already applied: the flags it returned then), followed by the
--          ids of the jobs whose stats in this call came late (none for a call
--          applied before); or, when a key
--          it would write, of any lane, is damaged, an error that names it
--          (include/keytypes.lua), and nothing written
-- Slot     dupefilter: the configured filter's fragment, that of its kind in
--          celery_crawl.dupefilter.filters.KINDS (it defines the dedup_* functions)
--
-- The level list of priority p is KEYS[1] .. ':' .. p, in the same hash tag;
-- every lane's keys are in it too, so children for another spider of the
-- group and the parent's ack are still one atomic step.

local DEDUP_KEY, COUNT_KEY, JOB_PREFIX = KEYS[3], KEYS[4], KEYS[6]
local n, s, m, d = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local a, e = tonumber(ARGV[10]), tonumber(ARGV[11])
local SCOPE, CALL, PARTICIPANT, FIRST = ARGV[6], ARGV[7], ARGV[9], 12
--!include entry_args
local DEDUP_ARGV = FIRST + ENTRY_WIDTH * n + 3 * s + 4 * a + m + d + 2 * e
--!slot dupefilter
--!include jobs
--!include push

-- a call applied before: its flags again, nothing changed (a record of the
-- wrong type is no record; the SET below replaces it)
if CALL ~= '' then
    local last = redis.pcall('GET', KEYS[8])
    if type(last) == 'string' and string.sub(last, 1, #CALL + 1) == CALL .. ':' then
        local flags = {}
        for i = #CALL + 2, #last do flags[#flags + 1] = tonumber(string.sub(last, i, i)) end
        return flags
    end
end

local lanes = {[0] = {KEYS[1], KEYS[2], KEYS[3], KEYS[4]}}
for j = 1, (#KEYS - 9) / 4 do
    local at = 6 + 4 * j
    lanes[j] = {KEYS[at], KEYS[at + 1], KEYS[at + 2], KEYS[at + 3]}
end
local base = FIRST + ENTRY_WIDTH * n  -- the job stat changes
local acked = base + 3 * s  -- the acked stat changes
local members = acked + 4 * a  -- the lease members
local ends = members + m + d  -- the jobs to end
-- every key it writes checked first (include/keytypes.lua): refused whole, or run whole
local spec = {}
spec_add(spec, KEYS[7], 'list')
for i = 0, s - 1 do job_guard(spec, ARGV[base + 3 * i]) end
for i = 0, a - 1 do job_guard(spec, ARGV[acked + 4 * i + 1]) end
for i = 0, e - 1 do job_guard(spec, ARGV[ends + 2 * i]) end
ack_guard(spec, KEYS[5], KEYS[9], ARGV, members, members + m - 1)
push_guard(spec, lanes, ARGV, FIRST, n)
local refused = refuse_damaged(spec)
if refused then return refused end

-- a job's stats that reach it after it ended from a process no longer among its
-- participants (cut off, back late) are kept apart: decided per job before any write,
-- so a limit this call reaches keeps its own call's changes on the job
local late, late_jobs = {}, {}
local function judge(job)
    if late[job] == nil then
        late[job] = PARTICIPANT ~= '' and job_late(job, PARTICIPANT)
        if late[job] then late_jobs[#late_jobs + 1] = job end
    end
end
for i = 0, s - 1 do judge(ARGV[base + 3 * i]) end
for i = 0, a - 1 do judge(ARGV[acked + 4 * i + 1]) end
-- which leases are still held, before the acks below finish them. One that lapsed while
-- its job runs was queued again (requeue.lua): the fetch that acks it counts the page, so
-- this ack's page stats are kept apart. Once its job has ended, its entry may have been
-- dropped unfetched (requeue.lua, a purge, a cancel): they count as an ended job's do.
local held, running = {}, {}
if a > 0 then
    for i = 1, m do held[i] = redis.call('ZSCORE', KEYS[5], ARGV[members + i - 1]) ~= false end
end
local function lapsed(lease, job)
    if held[lease] then return false end
    if running[job] == nil then running[job] = job_running(job) end
    return running[job]
end

-- the changes summed per job and field, in the order met: each counter is written once
local sums, order = {}, {}
local function gather(job, field, delta, apart)
    if field ~= 'purged' and (apart or late[job]) then field = 'late/' .. field end
    sums[job] = sums[job] or {}
    if sums[job][field] == nil then order[#order + 1] = {job, field} end
    sums[job][field] = (sums[job][field] or 0) + tonumber(delta)
end
for i = 0, s - 1 do
    local at = base + 3 * i
    gather(ARGV[at], ARGV[at + 1], ARGV[at + 2], false)
end
for i = 0, a - 1 do
    local at = acked + 4 * i
    gather(ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], lapsed(tonumber(ARGV[at]), ARGV[at + 1]))
end

local accepted = push_requests(lanes, ARGV, FIRST, n)
for _, change in ipairs(order) do
    local job, field = change[1], change[2]
    local delta = sums[job][field]
    if delta ~= 0 then
        job_add(job, field, delta)
        job_check_limits(job, field)  -- (a late/<field> is no limit)
    end
end
local letters = members + m
for i = letters, letters + d - 1 do redis.call('LPUSH', KEYS[7], ARGV[i]) end
if d > 0 then redis.call('LTRIM', KEYS[7], 0, tonumber(ARGV[5]) - 1) end
for i = 0, e - 1 do job_end(ARGV[ends + 2 * i], ARGV[ends + 2 * i + 1]) end
ack_leases(KEYS[1], KEYS[5], KEYS[9], ARGV, members, members + m - 1)
if CALL ~= '' then
    redis.call('SET', KEYS[8], CALL .. ':' .. table.concat(accepted), 'PX', ARGV[8])
end
for _, job in ipairs(late_jobs) do accepted[#accepted + 1] = job end
return accepted
