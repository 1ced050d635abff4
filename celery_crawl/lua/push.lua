-- Pushing requests into the level lists: included, never run alone.
--
-- Uses: dedup_add (dupefilter file), job_running and job_add (jobs.lua).
-- Defines: push_requests(levels, signal, args, first, n): reads n groups of
-- (priority, fingerprint, job id, payload) from args starting at index first;
-- returns a list of n flags, 1 = enqueued.

local SIGNAL_CAP = 64

local function push_requests(levels, signal, args, first, n)
    local accepted, added = {}, 0
    for i = 0, n - 1 do
        local at = first + 4 * i
        local priority, fp, job, payload = args[at], args[at + 1], args[at + 2], args[at + 3]
        if job_running(job) and (fp == '' or dedup_add(fp)) then
            redis.call('RPUSH', levels .. ':' .. priority, string.char(#job) .. job .. payload)
            redis.call('ZADD', levels, 'NX', -tonumber(priority), priority)
            job_add(job, 'pending', 1)
            accepted[i + 1], added = 1, added + 1
        else
            accepted[i + 1] = 0
        end
    end
    if added > 0 then
        for _ = 1, math.min(added, SIGNAL_CAP) do redis.call('RPUSH', signal, 1) end
        redis.call('LTRIM', signal, -SIGNAL_CAP, -1)
    end
    return accepted
end
