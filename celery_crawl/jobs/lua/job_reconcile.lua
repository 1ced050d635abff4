-- End the jobs whose requests are gone, incomplete, with the loss counted.
--
-- A job's pending count is how many of its requests are queued or leased. When
-- every queue of the group is empty (no priority level, no parked site, no
-- lease) and a running job still counts pending requests, those were lost: a
-- key was deleted, or Redis lost its last writes (AOF everysec, after a crash).
-- The first time this is seen the job is marked (field lost_check: its done
-- count, and when). Seen again ARGV[1] ms later, with no request of the job done
-- since, its pending count moves to fields lost and errors/lost, and the job
-- ends: incomplete (include/jobs.lua, job_outcome). The wait covers requests
-- that a process holds while Redis forgot their leases (the in-flight set was
-- deleted): their acks come within a lease time.
-- An active job whose state is neither running nor final (damaged) ends closed,
-- with reason 'damaged: state', when its queues are empty too.
-- While any queue of the group holds anything, the script is three ZCARDs a spider.
--
-- KEYS[1]  job key prefix: a job's hash is KEYS[1] .. job id
-- KEYS[2..] three per spider of the group: its queue levels, parked sites and
--          in-flight leases (sorted sets)
-- ARGV[1]  ms a job must stay so before it ends
-- Returns  the ids of the jobs ended; an error naming the key, nothing written, when a
--          key the ending of a job writes is damaged (job_guard, include/keytypes.lua).
--          An active job whose hash is of another type is no job: skipped (core/lua/repair.lua
--          moves it aside).

local JOB_PREFIX = KEYS[1]
--!include jobs

for i = 2, #KEYS do  -- the common case, while anything is queued: three ZCARDs a spider
    if redis.call('ZCARD', KEYS[i]) > 0 then return {} end
end

local spec = {}  -- checked before the first write (include/keytypes.lua)
job_guard(spec, '')
local refused = refuse_damaged(spec)
if refused then return refused end
local active = {}
for _, job in ipairs(redis.call('SMEMBERS', ACTIVE_JOBS_KEY)) do
    if job_exists(job) then
        active[#active + 1] = job
        job_guard(spec, job)
    end
end
refused = refuse_damaged(spec)
if refused then return refused end

local ended = {}
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
for _, job in ipairs(active) do
    local key = JOB_PREFIX .. job
    local values = redis.call('HMGET', key, 'state', 'pending', 'done', 'lost_check')
    local pending, done = tonumber(values[2] or '0') or 0, values[3] or '0'
    if values[1] and values[1] ~= 'running' and not FINAL[values[1]] then
        redis.call('HSET', key, 'state', 'running')
        job_end(job, 'damaged: state')
        ended[#ended + 1] = job
    elseif values[1] == 'running' and pending > 0 then
        local seen_done, seen_at = string.match(values[4] or '', '^(%-?%d+):(%d+)$')
        if seen_done ~= done then
            redis.call('HSET', key, 'lost_check', done .. ':' .. now)
        elseif now - tonumber(seen_at) >= tonumber(ARGV[1]) then
            redis.call('HSET', key, 'lost', pending, 'errors/lost', pending, 'pending', 0,
                'leased', 0)
            redis.call('HDEL', key, 'lost_check')
            job_finish_if_done(job)
            ended[#ended + 1] = job
        end
    end
end
return ended
