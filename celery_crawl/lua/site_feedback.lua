-- What a response says about a site, shared by every process (include/sites.lua).
--
-- KEYS[1]  the site's hash (Q:site:<site>)
-- KEYS[2]  the set of known sites (Q:site:~known)
-- ARGV[1]  the site
-- ARGV[2]  'gate': just before a download; nothing changes
--          'backoff': a back-off code; then ARGV[3] Retry-After in ms (-1: none),
--            ARGV[4] first back-off ms, ARGV[5] longest back-off ms, ARGV[6] back-offs in a
--            row that pause the site (0: never), ARGV[7] that pause in ms
--          'ok': any other response; strikes end. With AutoThrottle, ARGV[3] the latency ms,
--            ARGV[4] target concurrency, ARGV[5] start, ARGV[6] lowest, ARGV[7] highest
--            delay ms, ARGV[8] the status: the shared delay moves as Scrapy's AutoThrottle's
-- Returns  {ms the site is paused from now (0: not), back-offs in a row}
--
-- A back-off pauses the site until now + Retry-After, or else now + first * 2^(strikes-1),
-- at most the longest; never shorter than a pause already set. After ARGV[6] in a row,
-- the pause is ARGV[7]. The lease script leases nothing of a paused site.

local key, mode = KEYS[1], ARGV[2]
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local state = redis.call('HMGET', key, 'until', 'strikes', 'delay')
local paused, strikes = tonumber(state[1] or '0'), tonumber(state[2] or '0')

if mode == 'backoff' then
    strikes = strikes + 1
    local given, first, longest = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
    local pause = given >= 0 and given or math.min(longest, first * 2 ^ (strikes - 1))
    local after = tonumber(ARGV[6])
    if after > 0 and strikes >= after then pause = math.max(pause, tonumber(ARGV[7])) end
    local longer = math.max(0, now + pause - math.max(paused, now))  -- paused time it adds
    paused = math.max(paused, now + pause)
    redis.call('HSET', key, 'until', paused, 'strikes', strikes, 'backoff_at', now)
    redis.call('HINCRBY', key, 'backoffs', 1)
    redis.call('HINCRBY', key, 'paused_ms', longer)
    redis.call('SADD', KEYS[2], ARGV[1])
elseif mode == 'ok' then
    if strikes > 0 then
        strikes = 0
        redis.call('HSET', key, 'strikes', 0)
    end
    if ARGV[3] then
        local latency, target = tonumber(ARGV[3]), tonumber(ARGV[4])
        local low, high = tonumber(ARGV[6]), tonumber(ARGV[7])
        local delay = tonumber(state[3] or ARGV[5])
        local wanted = latency / target
        local estimate = math.max(low, math.min(high, math.max(wanted, (delay + wanted) / 2)))
        if tonumber(ARGV[8]) == 200 or estimate > delay then
            redis.call('HSET', key, 'delay', math.floor(estimate))
            redis.call('SADD', KEYS[2], ARGV[1])
        end
    end
end
return {math.max(0, paused - now), strikes}
