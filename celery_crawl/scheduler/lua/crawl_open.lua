-- A scheduler opens: it registers among the open schedulers and joins the crawl
-- they make, or, when no other is open, begins a new crawl. One step, so two
-- processes opening at once never both begin one.
--
-- KEYS[1]  open schedulers: sorted set, score = registration deadline (include/schedulers.lua)
-- KEYS[2]  the crawl's hash (celery_crawl.scheduler.crawl_state): started (ms, server clock), start (the
--          id of the scheduler that runs the start requests, or 'done'), and the
--          crawl-wide counts of CLOSESPIDER_*: pages, items, errors
-- KEYS[3]  the spider's stats hash, KEYS[4] its types hash (celery_crawl.stats.collector)
-- ARGV[1]  this scheduler's id
-- ARGV[2]  milliseconds the registration lasts unless renewed
-- ARGV[3]  '1': a new crawl starts with fresh stats (KEYS[3], KEYS[4] deleted)
-- Returns  {schedulers open before this one, the crawl's start (ms), the server's clock (ms)}
--          (an error naming the key, nothing written, when a key it writes is damaged:
--          include/keytypes.lua)

--!include schedulers
--!include keytypes

local crawl, id = KEYS[2], ARGV[1]
local refused = refuse_damaged({KEYS[1], 'zset', crawl, 'hash'})  -- include/keytypes.lua
if refused then return refused end
local now = schedulers_now()
redis.call('ZREM', KEYS[1], id)
local others = schedulers_prune(KEYS[1], now)
if others == 0 then  -- nobody else is open: whatever the hash holds is a past crawl's
    redis.call('DEL', crawl)
    if ARGV[3] == '1' then redis.call('DEL', KEYS[3], KEYS[4]) end
    redis.call('HSET', crawl, 'started', now)
end
schedulers_register(KEYS[1], id, tonumber(ARGV[2]), now)
local started = tonumber(redis.call('HGET', crawl, 'started') or now) or now  -- text: now
return {others, started, now}
