-- Delete a queue: its priority levels, level lists, leases, counter and signal.
--
-- KEYS[1]  queue levels: sorted set of priority levels
-- KEYS[2]  in-flight leases
-- KEYS[3]  lease counter
-- KEYS[4]  signal list
-- ARGV     none
-- Returns  the number of keys deleted

local deleted = 0
for _, level in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    deleted = deleted + redis.call('DEL', KEYS[1] .. ':' .. level)
end
return deleted + redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
