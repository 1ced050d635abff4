-- Run the dupefilter on its own (the scheduler uses enqueue.lua instead).
--
-- KEYS[1]  dupefilter key
-- KEYS[2]  dupefilter count
-- ARGV[1]  'add': ARGV[2..] are fingerprints; returns a flag per fingerprint, 1 = new
--          'clear': deletes every key of the filter; returns the number deleted
--          'memory': returns MEMORY USAGE summed over the filter's keys

local DEDUP_KEY, COUNT_KEY = KEYS[1], KEYS[2]
--!include dedup

if ARGV[1] == 'add' then
    local flags = {}
    for i = 2, #ARGV do flags[i - 1] = dedup_add(ARGV[i]) and 1 or 0 end
    return flags
elseif ARGV[1] == 'clear' then
    return dedup_clear()
elseif ARGV[1] == 'memory' then
    return dedup_memory()
end
return redis.error_reply('unknown dedup command ' .. tostring(ARGV[1]))
