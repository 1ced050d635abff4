-- A site's robots.txt Crawl-delay at download time, for every process together
-- (celery_crawl.politeness.robots): the requests leased before the delay was known,
-- or leased together, are spaced here, one delay apart.
--
-- KEYS[1]  the site's hash (include/sites.lua): robots (ms, its Crawl-delay), and
--          robots_next (ms: when its next download may start)
-- ARGV     none
-- Returns  ms the caller waits before its download (0: at once; 0 without a delay)

local key = KEYS[1]
if redis.call('TYPE', key).ok ~= 'hash' and redis.call('EXISTS', key) == 1 then return 0 end
local fields = redis.call('HMGET', key, 'robots', 'robots_next')
local delay = tonumber(fields[1] or '') or 0
if delay <= 0 then return 0 end
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local start = math.max(now, tonumber(fields[2] or '') or 0)
redis.call('HSET', key, 'robots_next', start + delay)
return start - now
