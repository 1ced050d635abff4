-- Finish leases: the requests are done and leave the queue for good; their
-- jobs count them as done (the same step the enqueue script takes for acks).
--
-- KEYS[1]  in-flight leases: sorted set, score = lease deadline (ms)
-- KEYS[2]  job key prefix: a job's hash is KEYS[2] .. job id
-- KEYS[3]  queue levels: sorted set of priority levels (its sites' leases name it)
-- KEYS[4]  the group's site prefix (include/sites.lua): sites' keys are derived from it
-- ARGV[1..] the lease members to finish
-- Returns  the number of members that were still leased; an error naming the key,
--          and nothing written, when a key it would write is damaged (keytypes.lua)

local JOB_PREFIX = KEYS[2]
--!include jobs

local spec = {}
ack_guard(spec, KEYS[1], KEYS[4], ARGV, 1, #ARGV)
local refused = refuse_damaged(spec)
if refused then return refused end
return ack_leases(KEYS[3], KEYS[1], KEYS[4], ARGV, 1, #ARGV)
