-- Close a running job whose time limit (field limit/seconds) has passed since it
-- was created (field created_at), both on the server's clock: a watcher whose own
-- clock is ahead or behind closes it neither early nor late.
--
-- KEYS[1]  job key prefix: a job's hash is KEYS[1] .. job id
-- ARGV[1]  job id
-- ARGV[2]  the reason it ends with (closespider_timeout)
-- Returns  1 if the job was closed, 0 otherwise

local JOB_PREFIX = KEYS[1]
--!include jobs

local job = ARGV[1]
if not job_exists(job) then return 0 end
local spec = {}  -- every key job_end writes checked first (include/keytypes.lua)
job_guard(spec, job)
local refused = refuse_damaged(spec)
if refused then return refused end
local values = redis.call('HMGET', JOB_PREFIX .. job, 'limit/seconds', 'created_at')
local limit, created = tonumber(values[1] or ''), tonumber(values[2] or '')
if not (limit and created) or limit <= 0 then return 0 end
local now = redis.call('TIME')
if now[1] + now[2] / 1000000 - created < limit then return 0 end
return job_end(job, ARGV[2])
