-- Read the worker registry with the server's clock, in one step.
--
-- KEYS[1]  worker registry: sorted set, member = a process's JSON entry,
--          score = its last beat, unix ms (server clock)
-- ARGV     none
-- Returns  {now in unix ms, member 1, score 1, member 2, score 2, ...}, as strings

local now = redis.call('TIME')
local found = {tostring(now[1] * 1000 + math.floor(now[2] / 1000))}
for _, value in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')) do
    found[#found + 1] = value
end
return found
