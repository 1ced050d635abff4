-- Run the dupefilter on its own (the scheduler uses enqueue.lua instead).
--
-- KEYS[1]  dupefilter key
-- KEYS[2]  dupefilter count
-- ARGV[1]  command:
--          'add': records the fingerprints; returns a flag per fingerprint, 1 = new
--          'seen': records nothing; returns a flag per fingerprint, 1 = seen before
--          'count': returns the number of fingerprints (an estimate for some kinds)
--          'config': creates the filter's stored parameters if missing; returns them
--                    as a flat list of name, value (empty for a kind with none)
--          'clear': deletes every key of the filter, its kind too; returns the number deleted
--          'claim': records the filter's kind (DEDUP_KIND) at KEYS[1]:kind unless a kind
--                   is there already; returns the kind that was there, or nil
--          'memory': returns MEMORY USAGE summed over the filter's keys
-- ARGV[2]  number of fingerprints n (0 for the commands that take none)
-- ARGV[3 .. 2 + n]  fingerprints
-- then     the dupefilter's parameters (DEDUP_ARGV: see the dupefilter's fragment)
-- Returns  what the command returns, as listed under ARGV[1]; an error naming the key,
--          nothing written, when a key of the filter it uses is damaged (dedup_guard,
--          include/keytypes.lua)
-- Slot     dupefilter: the configured filter's fragment, that of its kind in
--          celery_crawl.dupefilter.filters.KINDS (it defines the dedup_* functions)

local DEDUP_KEY, COUNT_KEY = KEYS[1], KEYS[2]
local n = tonumber(ARGV[2])
local DEDUP_ARGV = 3 + n
--!slot dupefilter
--!include dedup_keys

local function delete(key) return redis.call('DEL', key) end
local function memory(key) return redis.call('MEMORY', 'USAGE', key, 'SAMPLES', 0) or 0 end

local function each_fingerprint(check)
    local flags = {}
    for i = 1, n do flags[i] = check(ARGV[2 + i]) and 1 or 0 end
    return flags
end

local command = ARGV[1]
local spec = {}  -- checked before the first write: an add writes per fingerprint
spec_add(spec, dedup_kind_key(DEDUP_KEY), 'string')
local fps = {}
if command == 'add' then
    for i = 1, n do fps[i] = ARGV[2 + i] end
end
dedup_guard(spec, fps)
local refused = refuse_damaged(spec)
if refused then return refused end

if command == 'add' then return each_fingerprint(dedup_add)
elseif command == 'seen' then return each_fingerprint(dedup_seen)
elseif command == 'count' then return dedup_count()
elseif command == 'config' then return dedup_config()
elseif command == 'clear' then return dedup_each_key(delete) + delete(dedup_kind_key(DEDUP_KEY))
elseif command == 'claim' then
    local claimed = redis.call('GET', dedup_kind_key(DEDUP_KEY)) -- not SET NX GET: Redis < 7 refuses it
    if not claimed then redis.call('SET', dedup_kind_key(DEDUP_KEY), DEDUP_KIND) end
    return claimed
elseif command == 'memory' then return dedup_each_key(memory)
end
return redis.error_reply('unknown dedup command ' .. tostring(command))
