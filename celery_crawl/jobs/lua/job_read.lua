-- A job's hash and the server's clock, read together (Job.status): in one round trip,
-- which a Redis Cluster pipeline cannot do (TIME names no key, so it is refused there).
--
-- KEYS[1]  the job's hash
-- ARGV     none
-- Returns  {the hash's fields and values, flat; TIME's reply}
-- A key of another type makes HGETALL fail with WRONGTYPE, which the caller reports.

return {redis.call('HGETALL', KEYS[1]), redis.call('TIME')}
