-- The start requests of a crawl: where they stand, and their end (celery_crawl.crawl_state).
--
-- KEYS[1]  open schedulers: sorted set, score = registration deadline (include/schedulers.lua)
-- KEYS[2]  the crawl's hash: field start holds the id of the scheduler that runs the start
--          requests, or 'done' once they are all queued (lua/crawl_open.lua)
-- ARGV[1]  this scheduler's id
-- ARGV[2]  'check': where they stand; 'done': this scheduler queued them all
-- Returns  'done'; 'running' while another open scheduler runs them; 'mine' when this
--          one runs them, having taken them over from one that closed or was killed
--          before it was done (its registration lapsed), or from a crawl hash gone
--          (a restarted server)

--!include schedulers

local crawl, id = KEYS[2], ARGV[1]
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
