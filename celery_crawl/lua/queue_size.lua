-- Count queued requests over all priority levels (leases not included).
--
-- KEYS[1]  queue levels: sorted set of priority levels
-- ARGV     none
-- Returns  the number of queued requests

local total = 0
for _, level in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    total = total + redis.call('LLEN', KEYS[1] .. ':' .. level)
end
return total
