-- Enqueue a batch of requests, each checked against the dedup filter first,
-- and finish (ack) the leases of the requests that produced them, in one step.
--
-- KEYS[1]  queue levels: sorted set of priority levels, score = -priority
-- KEYS[2]  signal list: one token per request, wakes blocked pops
-- KEYS[3]  dupefilter key (bucket keys are derived from it)
-- KEYS[4]  dupefilter count
-- KEYS[5]  in-flight leases: sorted set, score = lease deadline (ms)
-- ARGV[1]  number of requests n
-- ARGV[2]  number of leases to ack m
-- ARGV[3 + 3i], ARGV[4 + 3i], ARGV[5 + 3i] for i in 0..n-1:
--          priority, fingerprint ('' = dont_filter, skip the check), payload
-- ARGV[3 + 3n .. 2 + 3n + m]  lease members to ack, after the requests are in
-- Returns  a list of n flags: 1 = enqueued, 0 = duplicate
--
-- The level list of priority p is KEYS[1] .. ':' .. p, in the same hash tag.
-- The line below is replaced by the dupefilter's .lua file, which defines
-- dedup_add(fp) over DEDUP_KEY and COUNT_KEY.

local DEDUP_KEY, COUNT_KEY = KEYS[3], KEYS[4]
local SIGNAL_CAP = 64
--!include dedup

local function enqueue(levels, priority, payload)
    redis.call('RPUSH', levels .. ':' .. priority, payload)
    redis.call('ZADD', levels, 'NX', -tonumber(priority), priority)
end

local n, m = tonumber(ARGV[1]), tonumber(ARGV[2])
local accepted, added = {}, 0
for i = 0, n - 1 do
    local priority, fp, payload = ARGV[3 + 3 * i], ARGV[4 + 3 * i], ARGV[5 + 3 * i]
    if fp == '' or dedup_add(fp) then
        enqueue(KEYS[1], priority, payload)
        accepted[i + 1], added = 1, added + 1
    else
        accepted[i + 1] = 0
    end
end
if added > 0 then
    for _ = 1, math.min(added, SIGNAL_CAP) do
        redis.call('RPUSH', KEYS[2], 1)
    end
    redis.call('LTRIM', KEYS[2], -SIGNAL_CAP, -1)
end
for i = 3 + 3 * n, 2 + 3 * n + m do
    redis.call('ZREM', KEYS[5], ARGV[i])
end
return accepted
