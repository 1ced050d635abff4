-- A spider's queue length and dedup size, for the exporter: one call per
-- spider, whatever the dupefilter class, and never O(queue) or O(fingerprints).
--
-- KEYS[1]  queue levels: sorted set of priority levels
-- KEYS[2]  dupefilter key D
-- KEYS[3]  dupefilter count
-- ARGV     none
-- Returns  {queued requests, fingerprints}: the dedup size as the dupefilter's
--          fragment include/dedup_size.lua reads it, whatever the filter's kind
--          (KEYS[3], or the count of a kind that keeps its own: Kind.size in
--          dupefilter/filters.py)

local DEDUP_KEY, COUNT_KEY, DEDUP_ARGV = KEYS[2], KEYS[3], 1
--!include levels
--!include dedup_size

local spec = {}  -- writes nothing; a queue key of another type, or a geometry that is not
queue_guard(spec, KEYS[1], nil)  -- numbers (a width of 0 would loop for good), is named
dedup_size_guard(spec)
local refused = refuse_damaged(spec)
if refused then return refused end

return {queue_length(KEYS[1]), dedup_size()}
