-- Register a scheduler as open on the spider's queue, or renew its registration.
--
-- KEYS[1]  open schedulers: sorted set of scheduler ids, score = registration
--          deadline (ms, the server's clock)
-- ARGV[1]  this scheduler's id
-- ARGV[2]  milliseconds the registration lasts unless renewed
-- Returns  the number of schedulers open, this one included
--
-- Registrations past their deadline (a killed process) are dropped here, and
-- the key expires with the newest deadline, so dead processes leave nothing.

local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now_ms)
redis.call('ZADD', KEYS[1], now_ms + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
