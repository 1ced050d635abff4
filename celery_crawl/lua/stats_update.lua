-- Apply a batch of stats changes to the shared stats hash.
--
-- KEYS[1]  stats hash: field -> value
-- KEYS[2]  types hash: field -> type tag (i int, f float, b bool, d datetime, s str, j json)
-- ARGV     groups of four: op, field, value, type tag
--          op is 'incr' (add), 'set', 'max', 'min', 'setnx' (set if absent),
--          'rate' (add to this minute's hash KEYS[1] .. ':rate:' .. minute, which
--          expires after RATE_TTL; rates over the last minute come from it) or
--          'clear' (delete both hashes; field, value and tag are ignored)
-- Returns  the number of operations applied
--
-- A field to add to that holds no number (damaged) starts afresh from the
-- value added, counted in celery_crawl/damaged/stats.

--!include counters

local stats, types = KEYS[1], KEYS[2]
local RATE_TTL = 900

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
        local key = stats .. ':rate:' .. math.floor(tonumber(redis.call('TIME')[1]) / 60)
        count(key, field, value)
        redis.call('EXPIRE', key, RATE_TTL)
    end,
    clear = function() redis.call('DEL', stats, types) end,
}

local applied = 0
for i = 1, #ARGV, 4 do
    local op = ops[ARGV[i]]
    if not op then return redis.error_reply('unknown stats op ' .. ARGV[i]) end
    op(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
    applied = applied + 1
end
return applied
