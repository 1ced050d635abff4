-- Pushing requests into the level lists: included, never run alone.
--
-- Uses: dedup_add, dedup_use and dedup_source (the dupefilter's fragment),
-- job_running, job_add, job_seen_add and job_source (include/jobs.lua), included
-- before it; SCOPE, the dedup scope: 'job' checks a job's requests against the
-- job's own set (job_seen_add), 'spider' against the spider's filter, for the
-- job's source (a hit-expiring filter keeps each source's apart). Requests of no
-- job always use the spider's filter. Includes keys (the key names).
-- Defines: push_requests(lanes, args, first, n): reads n groups, each the fields of
-- celery_crawl.core.entries.ENTRY_ARGV in its order (ENTRY_WIDTH of them,
-- include/entry_args.lua), from args starting at index first, and
-- pushes each into its lane: lanes[0] is the script's own queue, lanes[j] the
-- queue of another spider of the group, each {levels, signal, dupefilter,
-- dupefilter count}. Returns a list of n flags, 1 = enqueued.
-- push_guard(spec, lanes, args, first, n): adds to a guard spec (include/keytypes.lua)
-- every key push_requests will write for the same arguments, of every lane: its
-- index, signal and level lists, the dedup keys its requests meet (dedup_guard), the
-- jobs' keys (job_guard). Checked before the first write, so that a damaged key of
-- any spider of the group refuses the call whole, and names that key.

--!include keys
--!include entry_args

local SIGNAL_CAP = 64

local function wake(signal, added)
    for _ = 1, math.min(added, SIGNAL_CAP) do redis.call('RPUSH', signal, 1) end
    redis.call('LTRIM', signal, -SIGNAL_CAP, -1)
    redis.pcall('PUBLISH', signal, added)  -- a notice (never fails the script) to waiting processes
end

local function push_guard(spec, lanes, args, first, n)
    local fps = {}  -- per lane, per source: the fingerprints that meet its filter
    for i = 0, n - 1 do
        local at = first + ENTRY_WIDTH * i
        local fp, job, lane = args[at + 1], args[at + 2], tonumber(args[at + 4])
        local keys = lanes[lane]
        spec_add(spec, keys[1], 'zset')
        spec_add(spec, keys[2], 'list')
        spec_add(spec, level_key(keys[1], args[at]), 'list')
        job_guard(spec, job)
        if fp ~= '' and SCOPE == 'job' and job ~= '' then
            spec_add(spec, job_seen_key(job), 'set')
        elseif fp ~= '' then
            local source = job_source(job)
            fps[lane] = fps[lane] or {}
            fps[lane][source] = fps[lane][source] or {}
            table.insert(fps[lane][source], fp)
        end
    end
    for lane, sources in pairs(fps) do
        dedup_use(lanes[lane][3], lanes[lane][4])
        for source, list in pairs(sources) do
            dedup_source(source)
            dedup_guard(spec, list)
        end
    end
    dedup_use(lanes[0][3], lanes[0][4])
end

local function push_requests(lanes, args, first, n)
    local accepted, added, current = {}, {}, 0
    for i = 0, n - 1 do
        local at = first + ENTRY_WIDTH * i
        local priority, fp, job, payload = args[at], args[at + 1], args[at + 2], args[at + 3]
        local lane, site = tonumber(args[at + 4]), args[at + 5]
        local keys = lanes[lane]
        if lane ~= current then dedup_use(keys[3], keys[4]) end
        current = lane
        local own = SCOPE == 'job' and job ~= ''
        if not own and fp ~= '' then dedup_source(job_source(job)) end
        if job_running(job) and (fp == '' or (own and job_seen_add(job, fp))
                or (not own and dedup_add(fp))) then
            local flags, tail = #job, ''
            if not own and job ~= '' and fp ~= '' then  -- for cancel(): see entry_fp
                flags, tail = flags + 128, string.char(#fp) .. fp
            end
            if site ~= '' then  -- held to its site's limits: include/sites.lua
                flags, tail = flags + 64, tail .. string.char(#site) .. site
            end
            redis.call('RPUSH', level_key(keys[1], priority), string.char(flags) .. job .. tail .. payload)
            redis.call('ZADD', keys[1], 'NX', -tonumber(priority), priority)
            job_add(job, 'pending', 1)
            accepted[i + 1], added[lane] = 1, (added[lane] or 0) + 1
        else
            accepted[i + 1] = 0
        end
    end
    if current ~= 0 then dedup_use(lanes[0][3], lanes[0][4]) end
    for lane, count in pairs(added) do wake(lanes[lane][2], count) end
    return accepted
end
