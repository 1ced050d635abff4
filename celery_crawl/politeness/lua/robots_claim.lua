-- A host's robots.txt, shared by every process (celery_crawl.politeness.robots): read
-- the copy one process fetched, or claim the fetch.
--
-- KEYS[1]  the host's hash: body, ok ("1" fetched, "0" the fetch failed), and while a
--          fetch is under way, claim (its owner) and claim_until (ms)
-- ARGV[1]  owner: the claiming process
-- ARGV[2]  claim_ms: how long a claim holds before another process may take it
-- Returns  {'body', body, ok, pttl} when a copy is there (ok "0": the fetch failed;
--          pttl: the ms it is kept yet),
--          {'fetch', ''} when the caller is to fetch it (the claim is its), or
--          {'wait', ''} while another process's claim holds. A key of another type
--          is replaced: it holds a cache only.

local key, owner, claim_ms = KEYS[1], ARGV[1], tonumber(ARGV[2])
if redis.call('TYPE', key).ok ~= 'hash' and redis.call('EXISTS', key) == 1 then
    redis.call('DEL', key)
end
local ok, body, claim, until_ms = unpack(redis.call('HMGET', key, 'ok', 'body', 'claim', 'claim_until'))
if ok == '1' or ok == '0' then return {'body', body or '', ok, redis.call('PTTL', key)} end
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
if claim and claim ~= owner and (tonumber(until_ms) or 0) > now then return {'wait', ''} end
redis.call('HSET', key, 'claim', owner, 'claim_until', now + claim_ms)
redis.call('PEXPIRE', key, claim_ms * 2)
return {'fetch', ''}
