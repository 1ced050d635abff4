-- Pop up to n requests, highest priority first, and lease them in one step.
--
-- KEYS[1]  queue levels: sorted set of priority levels, score = -priority
-- KEYS[2]  in-flight leases: sorted set, score = lease deadline (ms)
-- KEYS[3]  lease counter
-- KEYS[4]  job key prefix: a job's hash is KEYS[4] .. job id
-- ARGV[1]  n, the most requests to lease
-- ARGV[2]  lease duration, ms (the deadline is taken from the server's clock)
-- ARGV[3]  'head' or 'tail': which end of a level list to pop
-- Returns  the leased members: 8-byte lease id .. 4-byte priority .. entry
--
-- A lease member is unique, so identical payloads never merge in flight. An
-- entry is: 1 byte job id length, the job id (a fingerprint may follow: entry_fp in
-- include/jobs.lua), the encoded request. An entry of
-- a job that no longer runs (closed at a limit) is discarded instead of leased.

local JOB_PREFIX = KEYS[4]
--!include jobs

local levels, inflight = KEYS[1], KEYS[2]
local now = redis.call('TIME')
local want = tonumber(ARGV[1])
local deadline = now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[2])
local pop = ARGV[3] == 'tail' and 'RPOP' or 'LPOP'
local leased = {}

while #leased < want do
    local top = redis.call('ZRANGE', levels, 0, 0)[1]
    if not top then break end
    local list = levels .. ':' .. top
    local payloads = redis.call(pop, list, want - #leased)
    if not payloads or redis.call('EXISTS', list) == 0 then
        redis.call('ZREM', levels, top)
    end
    if payloads then
        local first = redis.call('INCRBY', KEYS[3], #payloads) - #payloads
        for i, entry in ipairs(payloads) do
            local job = entry_job(entry, 1)
            if job_running(job) then
                local member = struct.pack('>I4I4i4', math.floor((first + i) / 2 ^ 32),
                    (first + i) % 2 ^ 32, tonumber(top)) .. entry
                redis.call('ZADD', inflight, deadline, member)
                job_leased(job)
                leased[#leased + 1] = member
            else
                job_add(job, 'pending', -1)
                job_add(job, 'purged', 1)
            end
        end
    end
end
return leased
