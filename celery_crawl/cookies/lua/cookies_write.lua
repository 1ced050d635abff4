-- Store changes to one shared cookie jar and give it a new version, in one step.
--
-- KEYS[1]  the jar: a hash of 'domain|path|name' -> the cookie as JSON, and
--          '~version' -> the jar's version (no cookie field lacks a '|')
-- ARGV[1]  seconds the jar is kept after this change
-- ARGV[2]  number of cookies to store, n
-- then n pairs: field, JSON
-- then the fields to delete (cookies the site deleted, or expired ones)
-- Returns  {new version, previous version} as strings; previous '0' for a new jar
--
-- A version is the server's clock in milliseconds, or one more than the last
-- version when that is larger: it grows even across the jar's expiry. A version of
-- text counts as none (the new one replaces it); a jar of another type is refused
-- before the first write, named (include/keytypes.lua).

--!include keytypes

local jar, ttl, n = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local refused = refuse_damaged({jar, 'hash'})
if refused then return refused end
local previous = tonumber(redis.call('HGET', jar, '~version') or '0') or 0
for i = 3, 2 + 2 * n, 2 do
    redis.call('HSET', jar, ARGV[i], ARGV[i + 1])
end
for i = 3 + 2 * n, #ARGV do
    redis.call('HDEL', jar, ARGV[i])
end
local now = redis.call('TIME')
local version = math.max(previous + 1, tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
redis.call('HSET', jar, '~version', string.format('%d', version))
redis.call('EXPIRE', jar, ttl)
return {string.format('%d', version), string.format('%d', previous)}
