-- Apply a batch of stats changes to the shared stats hash.
--
-- A call may reach Redis twice: its reply lost (Redis stopped, a connection
-- cut) after it ran, the client sends it again. A writer (a process's stats
-- collector) numbers its calls; the number of its last applied call is kept in
-- KEYS[3], and a call whose number is already there changes nothing: an
-- increment is added once. Every key is checked before the first write, so a
-- call refused for a damaged key (WRONGTYPE) has applied nothing either.
--
-- KEYS[1]  stats hash: field -> value
-- KEYS[2]  types hash: field -> type tag (i int, f float, b bool, d datetime, s str, j json)
-- KEYS[3]  the writer's record: string, the number of its last applied call
--          (not read or written when ARGV[1] is '')
-- ARGV[1]  the writer's number for this call ('' = none: the call is not recorded)
-- ARGV[2]  milliseconds the writer's record is kept
-- ARGV[3..] groups of four: op, field, value, type tag
--          op is 'incr' (add), 'set', 'max', 'min', 'setnx' (set if absent),
--          'rate' (add to this minute's hash, stats_rate_key(KEYS[1], minute), which
--          expires after RATE_TTL; rates over the last minute come from it) or
--          'clear' (delete both hashes; field, value and tag are ignored)
-- Returns  the number of operations applied (0 for a call applied before)
--
-- A field to add to that holds no number (damaged) starts afresh from the
-- value added, counted in celery_crawl/damaged/stats.

--!include counters
--!include keytypes
--!generated celery_crawl.core.keys:lua_stats_keys

local stats, types = KEYS[1], KEYS[2]
local RATE_TTL = 900
local rates = stats_rate_key(stats, math.floor(tonumber(redis.call('TIME')[1]) / 60))

local function less(a, b)
    local na, nb = tonumber(a), tonumber(b)
    if na and nb then return na < nb end
    return a < b
end

local function incr(field, value, tag)
    local current = redis.call('HGET', stats, field)
    if current and not tonumber(current) then  -- damaged: the count starts afresh
        count(stats, 'celery_crawl/damaged/stats', 1)
        current = false
        redis.call('HDEL', stats, field)
    end
    if tag == 'i' and (current == false or string.match(current, '^-?%d+$')) then
        redis.call('HINCRBY', stats, field, value)
        redis.call('HSETNX', types, field, 'i')
    else
        redis.call('HINCRBYFLOAT', stats, field, value)
        redis.call('HSET', types, field, 'f')
    end
end

local function put(field, value, tag)
    redis.call('HSET', stats, field, value)
    redis.call('HSET', types, field, tag)
end

local ops = {
    incr = incr,
    set = put,
    setnx = function(field, value, tag)
        if redis.call('HEXISTS', stats, field) == 0 then put(field, value, tag) end
    end,
    max = function(field, value, tag)
        local current = redis.call('HGET', stats, field)
        if current == false or less(current, value) then put(field, value, tag) end
    end,
    min = function(field, value, tag)
        local current = redis.call('HGET', stats, field)
        if current == false or less(value, current) then put(field, value, tag) end
    end,
    rate = function(field, value)
        count(rates, field, value)
        redis.call('EXPIRE', rates, RATE_TTL)
    end,
    clear = function() redis.call('DEL', stats, types) end,
}

local CALL, FIRST = ARGV[1], 3
if CALL ~= '' and redis.pcall('GET', KEYS[3]) == CALL then
    return 0  -- applied before: its reply was lost, and the client sent it again
end
local refusal = refuse_damaged({stats, 'hash', types, 'hash', rates, 'hash'})
if refusal then return refusal end
for i = FIRST, #ARGV, 4 do
    if not ops[ARGV[i]] then return redis.error_reply('unknown stats op ' .. ARGV[i]) end
end

local applied = 0
for i = FIRST, #ARGV, 4 do
    ops[ARGV[i]](ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    applied = applied + 1
end
if CALL ~= '' then redis.call('SET', KEYS[3], CALL, 'PX', ARGV[2]) end
return applied
