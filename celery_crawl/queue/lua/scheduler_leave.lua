-- A scheduler closes: it leaves the open schedulers and, if asked and it was
-- the last one open (registrations past their deadline do not count), deletes
-- the queue and the dedup filter. One step, so two processes closing at once
-- never both clear, nor both leave the state behind.
--
-- KEYS[1]  open schedulers: sorted set of scheduler ids, score = deadline (ms)
-- KEYS[2]  queue levels: sorted set of priority levels
-- KEYS[3]  in-flight leases
-- KEYS[4]  lease counter
-- KEYS[5]  signal list
-- KEYS[6]  dupefilter key (the filter's other keys are derived from it)
-- KEYS[7]  dupefilter count
-- KEYS[8]  the group's site prefix (include/sites.lua): sites' keys are derived from it
-- KEYS[9]  the crawl's hash (scheduler/lua/crawl_open.lua): deleted with the last scheduler, whatever
--          ARGV[2], so that the next process to open begins a new crawl
-- ARGV[1]  this scheduler's id
-- ARGV[2]  1: clear the queue and the dedup filter if no other scheduler is open; 0: never
-- then     the dupefilter's parameters, if it takes any (DEDUP_ARGV: see its fragment)
-- Returns  {schedulers still open, keys deleted}; an error naming the key, nothing written,
--          when a key it reads or writes is damaged (include/keytypes.lua): the open
--          schedulers, and with ARGV[2] = 1 every key of the queue and filter it would clear
-- Slot     dupefilter: the configured filter's fragment, that of its kind in
--          celery_crawl.dupefilter.filters.KINDS (it defines dedup_each_key)

local DEDUP_KEY, COUNT_KEY, DEDUP_ARGV = KEYS[6], KEYS[7], 3
--!slot dupefilter
--!include dedup_keys
--!include queue_delete

local spec = {}  -- checked before the first write: it leaves, then clears
spec_add(spec, KEYS[1], 'zset')
if ARGV[2] == '1' then
    queue_guard(spec, KEYS[2], KEYS[8])
    spec_add(spec, dedup_kind_key(DEDUP_KEY), 'string')
    dedup_guard(spec, {})  -- the filter's counts and parameters its keys are found from
end
local refused = refuse_damaged(spec)
if refused then return refused end

local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now_ms)
local open = redis.call('ZCARD', KEYS[1])
if open == 0 then redis.call('DEL', KEYS[9]) end
if open > 0 or ARGV[2] ~= '1' then return {open, 0} end

local function delete(key) return redis.call('DEL', key) end
local deleted = queue_delete(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[8])
deleted = deleted + dedup_each_key(delete) + delete(dedup_kind_key(DEDUP_KEY))
return {0, deleted}
