-- Counters that heal: included, never run alone.
--
-- HINCRBY fails on a field that holds no integer (damaged), and a script that
-- fails half-way keeps what it already did: entries it popped would be lost.
-- count() adds with pcall instead. On a damaged value it keeps the old one in
-- field .. '~damaged' and starts the count afresh from delta. A hash of another
-- type makes it give up on this count (core/lua/repair.lua moves such a key aside
-- when a script that needs it fails).
--
-- Uses: nothing from the including script.
-- Defines: count(key, field, delta): the new value and whether the field was
-- damaged (nil, true when the key itself is of the wrong type).

local function count(key, field, delta)
    local value = redis.pcall('HINCRBY', key, field, delta)
    if type(value) == 'number' then return value, false end
    local old = redis.pcall('HGET', key, field)
    if type(old) ~= 'string' then return nil, true end  -- the key is not a hash
    redis.call('HSET', key, field .. '~damaged', old, field, delta)
    return delta, true
end
