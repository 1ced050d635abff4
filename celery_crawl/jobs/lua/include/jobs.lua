-- Job bookkeeping: included by the queue scripts, never run alone.
--
-- A job is a hash JOB_PREFIX .. job_id in the spider's hash tag, with fields
-- state (running, done, incomplete, failed, cancelled), pending (requests enqueued and not yet
-- acked), leased (of those, the ones in flight), done (acked), per-job stats,
-- finished_at, and keep (seconds it stays once finished). A job is done when
-- pending drops to 0 on an ack: the ack comes after the children of the acked request were counted in, so pending
-- never touches 0 while a derived request is outstanding.
--
-- A queue entry starts with its job id (include/entries.lua): with the spider
-- dedup scope, a job's request that was filtered carries its fingerprint too,
-- for cancel() to take it out of the filter (entry_fp).
--
-- A job ends failed instead of done when not one page was fetched and errors
-- were counted (fields errors/<kind>): the site was down, every download failed.
-- It ends incomplete when pages were fetched but requests of it were dropped
-- because they could not be queued (field dropped, with errors/dropped/<kind>),
-- or were lost from Redis (field lost: jobs/lua/job_reconcile.lua): the crawl did
-- not cover what the spider asked for.
--
-- Stats of a job that reach it once it has ended, from a process no longer among its
-- participants (a worker cut off for longer than its leases, back after another finished
-- the job) are kept apart, in fields late/<field> (queue/lua/enqueue.lua): the counters
-- Job.wait() returned do not move.
--
-- A job's phase (field phase) is queued (no request leased yet), running,
-- done, incomplete, failed or cancelled. The hash JOB_STATES_KEY counts
-- jobs per phase, so the exporter reads them in one command: queued and running
-- are current counts, the final phases only ever grow. The set ACTIVE_JOBS_KEY
-- holds the ids of the queued and running jobs.
--
-- A job ends closed (field reason) when it reaches one of its limits (fields
-- limit/<name> of the limits Redis checks, celery_crawl.jobs.limits.COUNTED: checked
-- by job_check_limits as its stats grow), or
-- when a callback raised CloseSpider (queue/lua/enqueue.lua, with the ack of its page;
-- jobs/lua/job_end.lua for Job.close()): at once, with its
-- queued requests left behind to be discarded when a lease reaches them.
--
-- With the job dedup scope, the fingerprints of a job's requests are in the set
-- JOB_PREFIX .. job_id .. ':seen' (job_seen_add), deleted when the job ends.
--
-- The processes that work on a job are its participants: the hash
-- JOB_PREFIX .. job_id .. ':participants' maps each one's scheduler id to the key
-- of its scheduler registration (jobs/lua/job_join.lua). When the job ends (done,
-- incomplete, failed, cancelled or closed), job_notify pushes its id onto each
-- participant's list JOB_PREFIX .. '~ended:' .. scheduler id; each one closes its
-- part of the job (pipelines' close_job, feeds, the job_finished signal) and
-- leaves (jobs/lua/job_leave.lua). The last to leave pushes the done tokens again:
-- Job.wait() returns once the job has ended and no participant is left.
--
-- A counter read to decide (pending, pages, dropped, lost, errors/*, a limit) that
-- holds no number counts as 0 (a limit as none): a decision never throws half-way.
-- The keys the bookkeeping of a job writes are in job_guard, those of an ack in
-- ack_guard, for a script's check before its first write (include/keytypes.lua).
--
-- Uses: JOB_PREFIX. Includes counters, keytypes and sites (and with it entries); its
-- tables FINAL, JOB_COUNTERS and LIMITED are generated from celery_crawl.jobs.store.
-- Defines: FINAL, JOB_COUNTERS, LIMITED, JOB_SOURCES, job_source, job_seen_add, job_running, job_late, job_add, job_phase,
-- job_ack, job_finish_if_done, job_end, job_check_limits, ack_leases, job_wake,
-- job_notify, job_guard(spec, job), ack_guard(spec, inflight, args, first, last).
-- (ack_leases(levels, inflight, args, first, last) takes the queue's levels key and its
-- in-flight key, both from KEYS.)

--!include counters
--!include keytypes
--!include sites

local JOB_TTL = 7 * 24 * 3600  -- a running job's participants; a finished job: its field keep
local DONE_TOKENS = 16
local ENDED_TTL = 24 * 3600  -- a dead participant's list of ended jobs

-- FINAL: the final states, as a set; JOB_COUNTERS: a job hash's counters; LIMITED: the
-- limits checked as a job's field grows -> the reason it is closed with when reached
--!generated celery_crawl.jobs.store:lua_tables
-- the keys beside the job hashes: JOB_STATES_KEY, ACTIVE_JOBS_KEY, job_ended_key(participant),
-- job_participants_key(job), job_done_key(job), job_seen_key(job)
--!generated celery_crawl.core.keys:lua_job_keys

-- A job hash of another type (damaged) counts as no job: core/lua/repair.lua moves it aside.
local function job_exists(job)
    return job ~= '' and redis.call('TYPE', JOB_PREFIX .. job)['ok'] == 'hash'
end

-- The source of a job (its field source, a source of the producer's schedule; '' for
-- none), read once per script run. A script that creates the job fills JOB_SOURCES[job]
-- before its hash exists.
local JOB_SOURCES = {}
local function job_source(job)
    if job == '' then return '' end
    if JOB_SOURCES[job] == nil then
        local source = redis.pcall('HGET', JOB_PREFIX .. job, 'source')  -- damaged: none
        JOB_SOURCES[job] = type(source) == 'string' and source or ''
    end
    return JOB_SOURCES[job]
end

-- Job dedup scope: true when fp is new to the job (and records it).
local function job_seen_add(job, fp)
    return redis.call('SADD', job_seen_key(job), fp) == 1
end

local function job_running(job)  -- pcall: a damaged job hash is not running
    return job == '' or redis.pcall('HGET', JOB_PREFIX .. job, 'state') == 'running'
end

-- A job's stats that come after it ended from a process that is not among its
-- participants (cut off, its registration lapsed and dropped by jobs/lua/job_settle.lua, so
-- Job.wait() may have returned) are late: kept apart, in its fields late/<field>.
-- True when the job is gone, or its state is final and participant is not in it.
local function job_late(job, participant)
    if job == '' then return false end
    if not job_exists(job) then return true end
    local key = JOB_PREFIX .. job
    if not FINAL[redis.call('HGET', key, 'state')] then return false end
    return redis.pcall('HEXISTS', job_participants_key(job), participant) ~= 1
end

local job_end  -- defined below; a damaged counter closes its job

-- Add to a counter of the job; a counter that held no integer ends the job closed.
local function job_count(job, field, delta)
    local value, damaged = count(JOB_PREFIX .. job, field, delta)
    if damaged then job_end(job, 'damaged: ' .. field) end
    return value
end

local function job_add(job, field, delta)
    if job_exists(job) then job_count(job, field, delta) end
end

-- Move the job to phase; its old phase's count drops, the new one's grows.
local function job_phase(job, phase)
    local key = JOB_PREFIX .. job
    local old = redis.call('HGET', key, 'phase')
    if old == phase or FINAL[old] then return end
    local states = JOB_STATES_KEY
    if old then count(states, old, -1) end
    count(states, phase, 1)
    redis.call('HSET', key, 'phase', phase)
    if phase == 'queued' or phase == 'running' then
        redis.call('SADD', ACTIVE_JOBS_KEY, job)
    else
        redis.call('SREM', ACTIVE_JOBS_KEY, job)
    end
end

-- A request of the job was leased: a queued job now runs.
local function job_leased(job)
    if not job_exists(job) then return end
    -- only the first lease can find the job queued: skip the HGET otherwise
    if job_count(job, 'leased', 1) == 1
        and redis.call('HGET', JOB_PREFIX .. job, 'phase') == 'queued' then
        job_phase(job, 'running')
    end
end

local function number_or_0(value)
    return tonumber(value) or 0
end

-- How a running job ends: failed when no page came back and errors were counted,
-- incomplete when requests were dropped (and a page came back, or no error was
-- counted), done otherwise.
local function job_outcome(key)
    local counts = redis.call('HMGET', key, 'pages', 'dropped', 'lost')
    local short = number_or_0(counts[2]) > 0 or number_or_0(counts[3]) > 0
    local ended = short and 'incomplete' or 'done'
    if number_or_0(counts[1]) > 0 then return ended end
    local fields = redis.call('HGETALL', key)
    for i = 1, #fields, 2 do
        if string.sub(fields[i], 1, 7) == 'errors/' and number_or_0(fields[i + 1]) > 0 then
            return 'failed'
        end
    end
    return ended
end

-- Seconds a finished job stays readable: its field keep (CELERY_CRAWL_JOB_KEEP_SECONDS).
local function job_keep(job)
    local keep = tonumber(redis.call('HGET', JOB_PREFIX .. job, 'keep') or '')
    if keep and keep > 0 then return math.floor(keep) end
    return JOB_TTL
end

-- Wake Job.wait(): DONE_TOKENS tokens on the job's done list.
local function job_wake(job)
    local done = job_done_key(job)
    for _ = 1, DONE_TOKENS do redis.call('RPUSH', done, 1) end
    redis.call('EXPIRE', done, job_keep(job))
end

-- A finished job's hash and participants expire after its keep time.
local function job_expire(job)
    local key, keep = JOB_PREFIX .. job, job_keep(job)
    redis.call('EXPIRE', key, keep)
    redis.call('EXPIRE', job_participants_key(job), keep)
end

-- Tell every participant of the job that it ended.
local function job_notify(job)
    local participants = redis.call('HKEYS', job_participants_key(job))
    for _, participant in ipairs(participants) do
        local ended = job_ended_key(participant)
        redis.call('RPUSH', ended, job)
        redis.call('EXPIRE', ended, ENDED_TTL)
        redis.pcall('PUBLISH', ended, job)  -- its process drains the list; pcall: never fails
    end
end

local function job_finish_if_done(job)
    local key = JOB_PREFIX .. job
    if (tonumber(redis.call('HGET', key, 'pending') or '1') or 1) > 0 then return end
    local state = redis.call('HGET', key, 'state')
    if state ~= 'running' and state ~= 'cancelled' then return end
    local now = redis.call('TIME')
    local final = state == 'running' and job_outcome(key) or state
    redis.call('HSET', key, 'state', final, 'finished_at', now[1] + now[2] / 1000000)
    redis.call('DEL', job_seen_key(job))
    job_phase(job, final)
    job_wake(job)
    job_notify(job)
    job_expire(job)
end

-- End a running job now, closed, with the reason; returns 1, or 0 if it was not running.
-- Its requests in flight finish as usual; queued ones are discarded when leased.
function job_end(job, reason)
    local key = JOB_PREFIX .. job
    if redis.call('HGET', key, 'state') ~= 'running' then return 0 end
    local now = redis.call('TIME')
    redis.call('HSET', key, 'state', 'closed', 'reason', reason,
        'finished_at', now[1] + now[2] / 1000000)
    redis.call('DEL', job_seen_key(job))
    job_phase(job, 'closed')
    job_wake(job)
    job_notify(job)
    job_expire(job)
    return 1
end

-- After the job's stat field grew: close the job if it reached that field's limit
-- (LIMITED, generated from celery_crawl.jobs.limits.COUNTED, with each limit's reason).
local function job_check_limits(job, field)
    if not LIMITED[field] or not job_exists(job) then return end
    local values = redis.call('HMGET', JOB_PREFIX .. job, 'limit/' .. field, field)
    local limit = tonumber(values[1])
    if limit and number_or_0(values[2]) >= limit then
        job_end(job, LIMITED[field])
    end
end

-- A leased request of the job is finished (crawled, failed, or dropped).
local function job_ack(job)
    if not job_exists(job) then return end
    local key = JOB_PREFIX .. job
    job_count(job, 'pending', -1)
    job_count(job, 'leased', -1)
    job_count(job, 'done', 1)
    job_finish_if_done(job)
end

-- Finish leases args[first .. last] of the in-flight set of the queue whose levels key
-- is levels (sites: the group's site prefix, include/sites.lua); returns how many were held.
-- A member no longer leased (acked before, or requeued) is skipped.
-- A lease of a site with a cap gives the site its slot back (include/sites.lua).
local function ack_leases(levels, inflight, sites, args, first, last)
    local acked = 0
    for i = first, last do
        if redis.call('ZREM', inflight, args[i]) == 1 then
            job_ack(entry_job(args[i], 13))
            site_release(sites, levels, args[i])
            acked = acked + 1
        end
    end
    return acked
end

-- The keys the bookkeeping of job may write, added to a guard spec: the job index
-- (job_phase), its participants and done list (job_notify, job_wake). A job hash of
-- another type is no job (job_exists), and its counters heal (counters.lua).
local function job_guard(spec, job)
    spec_add(spec, JOB_STATES_KEY, 'hash')
    spec_add(spec, ACTIVE_JOBS_KEY, 'set')
    -- once per job and spec: the participants it reads (HKEYS) are read once
    if job == '' or spec[job_participants_key(job)] then return end
    spec_add(spec, job_participants_key(job), 'hash')
    spec_add(spec, job_done_key(job), 'list')
    -- job_notify pushes onto each participant's list of ended jobs
    local participants = redis.pcall('HKEYS', job_participants_key(job))
    if type(participants) == 'table' and not participants.err then
        for _, participant in ipairs(participants) do
            spec_add(spec, job_ended_key(participant), 'list')
        end
    end
end

-- The keys ack_leases(levels, inflight, sites, args, first, last) may write, added to a
-- guard spec.
local function ack_guard(spec, inflight, sites, args, first, last)
    spec_add(spec, inflight, 'zset')
    job_guard(spec, '')
    for i = first, last do
        job_guard(spec, entry_job(args[i], 13))
        local site = site_counted(args[i])
        if site then
            spec_add(spec, site_leases_key(sites, site), 'zset')
            spec_add(spec, site_waiting_key(sites, site), 'set')
        end
    end
end
