-- The start requests of a crawl: where they stand, and their end (celery_crawl.scheduler.crawl_state).
--
-- KEYS[1]  open schedulers: sorted set, score = registration deadline (include/schedulers.lua)
-- KEYS[2]  the crawl's hash: field start holds the id of the scheduler that runs the start
--          requests, or 'done' once they are all queued
-- ARGV[1]  this scheduler's id
-- ARGV[2]  'claim': run them, unless another scheduler does or did; 'done': this
--          scheduler queued them all
-- Returns  'done'; 'running' while another open scheduler runs them; 'mine' when this
--          (an error naming the key, nothing written, when a key it writes is damaged:
--          include/keytypes.lua)
--          one runs them: nobody claimed them yet, or the one that did closed or was
--          killed before it was done (its registration lapsed), or the crawl's hash is
--          gone (a restarted server)

--!include schedulers
--!include keytypes

local crawl, id = KEYS[2], ARGV[1]
local refused = refuse_damaged({KEYS[1], 'zset', crawl, 'hash'})  -- include/keytypes.lua
if refused then return refused end
local holder = redis.call('HGET', crawl, 'start')
if ARGV[2] == 'done' then
    if holder == id then redis.call('HSET', crawl, 'start', 'done') end
    return 'done'
end
if holder == 'done' then return 'done' end
if holder == id then return 'mine' end
if holder and schedulers_is_open(KEYS[1], holder, schedulers_now()) then return 'running' end
redis.call('HSET', crawl, 'start', id)
return 'mine'
