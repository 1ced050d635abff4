-- A worker process's heartbeat: its entry in the worker registry, stamped now.
--
-- KEYS[1]  worker registry: sorted set, member = the process's JSON entry,
--          score = its last beat, unix ms (server clock)
-- ARGV[1]  the process's entry (JSON: id, hostname, pid, spiders, started)
-- ARGV[2]  ms after its last beat that an entry is forgotten (any process's)
-- Returns  the number of forgotten entries removed
--
-- Entries stay a while after their process stopped beating, so that status
-- can show a lost worker; live is decided by the reader, from the score.
-- A registry of another type is refused before the first write, named
-- (include/keytypes.lua).

--!include keytypes

local refused = refuse_damaged({KEYS[1], 'zset'})
if refused then return refused end

local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now_ms - tonumber(ARGV[2])))
