-- Read one shared cookie jar, unless the caller's copy is current.
--
-- KEYS[1]  the jar (layout in cookies_write.lua)
-- ARGV[1]  the version of the caller's copy ('0': none)
-- Returns  {version} when the copy is current, else {version, field, JSON, field,
--          JSON, ...}: every cookie of the jar. Version '0': there is no jar. A jar of
--          another type is refused, named (include/keytypes.lua): the caller repairs it.

--!include keytypes

local refused = refuse_damaged({KEYS[1], 'hash'})
if refused then return refused end
local version = redis.call('HGET', KEYS[1], '~version') or '0'
if version == ARGV[1] then return {version} end
local fields = redis.call('HGETALL', KEYS[1])
local out = {version}
for i = 1, #fields, 2 do
    if fields[i] ~= '~version' then
        out[#out + 1] = fields[i]
        out[#out + 1] = fields[i + 1]
    end
end
return out
