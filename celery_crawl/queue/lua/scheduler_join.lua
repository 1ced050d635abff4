-- Register a scheduler as open on the spider's queue, or renew its registration.
--
-- KEYS[1]  open schedulers: sorted set of scheduler ids, score = registration
--          deadline (ms, the server's clock): include/schedulers.lua
-- ARGV[1]  this scheduler's id
-- ARGV[2]  milliseconds the registration lasts unless renewed
-- Returns  the number of schedulers open, this one included
--
-- Registrations past their deadline (a killed process) are dropped here, and
-- the key expires with the newest deadline, so dead processes leave nothing.
-- A scheduler's first registration is scheduler/lua/crawl_open.lua. A KEYS[1] of another type is
-- refused before the first write, named (include/keytypes.lua).

--!include schedulers
--!include keytypes

local refused = refuse_damaged({KEYS[1], 'zset'})
if refused then return refused end
local now = schedulers_now()
schedulers_prune(KEYS[1], now)
schedulers_register(KEYS[1], ARGV[1], tonumber(ARGV[2]), now)
return redis.call('ZCARD', KEYS[1])
