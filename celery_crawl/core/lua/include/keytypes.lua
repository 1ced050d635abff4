-- Keys of the wrong type, found before a script writes: included, never run alone.
--
-- Redis does not undo a script that fails half-way: entries it popped before a
-- command met a key of the wrong type (WRONGTYPE) would be lost. A script that
-- pops first checks, with read-only commands, the keys it will write, and
-- refuses the whole call while one of them is damaged: the caller's repair
-- (core/lua/repair.lua) moves the key aside, and the next call goes through.
--
-- A script checks every key it may write, of every spider of the group its call
-- touches, before its first write; a counter that must hold an integer is checked
-- too (a tonumber() of text is nil, and comparing nil throws). The refusal names
-- the key and the type it should hold: celery_crawl/core/repair.py parses it
-- (REFUSAL), moves THAT key aside, whichever spider of the group it belongs to,
-- and the call is sent again.
--
-- Uses: nothing from the including script.
-- Defines: spec_add(spec, key, type): adds a key to check to spec, once (a spec
-- remembers its keys under their names).
-- key_type_problem(spec): spec is {key, type, key, type, ...}, a type
-- being a Redis type, 'counter' (a string that INCRBY takes) or 'numbers' (a hash
-- whose every value is a positive finite number: a dedup filter's parameters, which
-- its arithmetic divides by and loops over); returns the first key of another type,
-- with the type wanted, or nil. A missing key is fine.
-- refuse_damaged(spec): the refusal to return, an error reply (WRONGTYPE, naming
-- the key), or nil when every key is of its type.

local function spec_add(spec, key, wanted)
    if spec[key] then return end
    spec[key] = true
    spec[#spec + 1] = key
    spec[#spec + 1] = wanted
end

local function key_numbers_problem(key)  -- a hash with a value that is no positive number
    for _, value in ipairs(redis.call('HVALS', key)) do
        local n = tonumber(value)
        if not (n and n > 0 and n < math.huge) then return true end
    end
    return false
end

local function key_type_problem(spec)
    for i = 1, #spec, 2 do
        local key, wanted = spec[i], spec[i + 1]
        local found = redis.call('TYPE', key)['ok']
        if wanted == 'counter' then
            local value = found == 'string' and redis.call('GET', key)
            if found ~= 'none' and not (value and string.match(value, '^%-?%d+$')) then
                return key, 'an integer'
            end
        elseif wanted == 'numbers' then
            if found ~= 'none' and (found ~= 'hash' or key_numbers_problem(key)) then
                return key, 'a hash of positive numbers'
            end
        elseif found ~= 'none' and found ~= wanted then
            return key, 'a ' .. wanted
        end
    end
    return nil
end

local function refuse_damaged(spec)
    local key, wanted = key_type_problem(spec)
    if key then
        return redis.error_reply('WRONGTYPE damaged key ' .. key .. ': it should hold ' .. wanted)
    end
    return nil
end
