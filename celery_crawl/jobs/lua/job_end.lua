-- Close a running job now, with a reason: Job.close(). (A callback's CloseSpider
-- ends its job in queue/lua/enqueue.lua, with its page's ack; the time limit in
-- job_timeout.lua: both through include/jobs.lua's job_end, as this script.)
-- Requests of the job in flight finish normally, their children are refused;
-- its queued requests are discarded when a lease reaches them.
--
-- KEYS[1]  job key prefix: a job's hash is KEYS[1] .. job id
-- ARGV[1]  job id
-- ARGV[2]  the reason (CloseSpider's, or closespider_timeout)
-- Returns  1 if the job was closed, 0 if it was not running
--          (an error naming the key, nothing written, when a key it writes is damaged:
--          include/keytypes.lua)

local JOB_PREFIX = KEYS[1]
--!include jobs

local spec = {}  -- every key it writes checked first (include/keytypes.lua)
job_guard(spec, ARGV[1])
local refused = refuse_damaged(spec)
if refused then return refused end
return job_end(ARGV[1], ARGV[2])
