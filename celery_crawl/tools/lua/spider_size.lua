-- A spider's queue length and dedup size, for the exporter: one call per
-- spider, whatever the dupefilter class, and never O(queue) or O(fingerprints).
--
-- KEYS[1]  queue levels: sorted set of priority levels
-- KEYS[2]  dupefilter key D
-- KEYS[3]  dupefilter count
-- ARGV     none
-- Returns  {queued requests, fingerprints}: the exact count, the bloom
--          filter's estimate (both in KEYS[3]), or, for an expiring filter
--          (D:expiring exists), its own count over its live time buckets

local DEDUP_KEY, COUNT_KEY, DEDUP_ARGV = KEYS[2], KEYS[3], 1
--!include levels
--!include dedup_expiring

local spec = {}  -- writes nothing; a queue key of another type, or a geometry that is not
queue_guard(spec, KEYS[1], nil)  -- numbers (a width of 0 would loop for good), is named
if redis.call('EXISTS', DEDUP_KEY .. ':expiring') == 1 then dedup_guard(spec, {}) end
local refused = refuse_damaged(spec)
if refused then return refused end

local queued = queue_length(KEYS[1])
if redis.call('EXISTS', DEDUP_KEY .. ':expiring') == 1 then
    return {queued, dedup_count()}  -- the stored window and width: no ARGV needed
end
return {queued, tonumber(redis.call('GET', COUNT_KEY) or '0')}
