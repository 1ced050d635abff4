-- Push the deadline of leases still held further out.
--
-- KEYS[1]  in-flight leases: sorted set, score = lease deadline (ms)
-- ARGV[1]  lease duration from now, ms (server clock)
-- ARGV[2..] the lease members to extend; members no longer leased are skipped
-- Returns  the number of leases extended

local now = redis.call('TIME')
local deadline = now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[1])
local extended = 0
for i = 2, #ARGV do
    extended = extended + redis.call('ZADD', KEYS[1], 'XX', 'CH', deadline, ARGV[i])
end
return extended
