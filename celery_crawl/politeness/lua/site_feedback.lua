-- What a response says about a site, shared by every process (include/sites.lua).
--
-- KEYS[1]  the site's hash (S:<site>)
-- KEYS[2]  the set of known sites (S:~known)
-- KEYS[3]  the site's leases held now (S:<site>:leases)
-- ARGV[1]  the site
-- ARGV[2]  the mode, and its arguments (named in MODE_ARGUMENTS):
--          'gate': just before a download; the overload window restarts after an idle spell
--          'backoff': a back-off code; retry_after_ms Retry-After (-1: none), first_ms the
--            first back-off, longest_ms the longest, pause_after back-offs in a row that
--            pause the site (0: never), pause_ms that pause
--          'error': a server error without Retry-After; share of the window's responses
--            above which the site is overloaded, window (responses), least the fewest
--            responses that tell, longest_ms the longest interval
--          'ok': any other response; strikes end. With AutoThrottle, latency_ms, target
--            concurrency, start_ms, lowest_ms and highest_ms delays, and the status: the
--            shared estimate moves as Scrapy's AutoThrottle's
--          'robots': the site's robots.txt was read; crawl_delay_ms its Crawl-delay
--            (0: none), the least time between the site's leases (field robots)
-- ARGV[3]  every mode: the recovery ms, in which a slowdown's interval halves (it recovers
--          first, each call)
-- ARGV[4..] the mode's arguments, in the order of MODE_ARGUMENTS[mode], a table generated
--          from celery_crawl.politeness.sites.FEEDBACK_MODES: read here by name
-- Returns  {ms the site is paused from now (0: not), back-offs in a row,
--           the interval ms a slowdown set in this call (0: none)}; an error naming the
--           key, nothing written, when KEYS[1] or KEYS[2] is of another type
--           (include/keytypes.lua). A field that holds no number reads as none, and a
--           count of text starts afresh (include/counters.lua).
--
-- Pauses: a back-off pauses the site until now + Retry-After, or else now + first *
-- 2^(strikes-1), at most the longest; never shorter than a pause already set. After
-- pause_after in a row, the pause is pause_ms. The lease script leases nothing of a paused
-- site.
--
-- Slowdowns: the site's responses are counted as its leases that ended (leased, less those
-- held now). The window holds the last `window` of them and their server errors (win_from:
-- the count it starts at, win_at: when, win_errors). An error that makes them more
-- than `share` of at least `least` responses slows the site to the rate its other responses
-- came at, less that share (slow: ms between leases, set at slowed_at); the interval then
-- halves every ARGV[3] ms. The lease honours delay: the longer of the slowdown and
-- AutoThrottle's estimate (throttle).

--!include counters
--!include keytypes
--!generated celery_crawl.politeness.sites:lua_feedback_modes

local key, mode = KEYS[1], ARGV[2]
local refused = refuse_damaged({key, 'hash', KEYS[2], 'set'})  -- KEYS[3] is read with pcall
if refused then return refused end
local IDLE_MS = 5000  -- a window that saw no download for this long (or 4 intervals) restarts
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local FIELDS = {'until', 'strikes', 'delay', 'throttle', 'slow', 'slowed_at', 'win_at',
    'win_from', 'win_errors', 'win_seen'}
local s = {}
local values = redis.call('HMGET', key, unpack(FIELDS))
for i, name in ipairs(FIELDS) do s[name] = tonumber(values[i]) end
local paused, strikes = s['until'] or 0, s.strikes or 0
local recovery = tonumber(ARGV[3])
if not MODE_ARGUMENTS[mode] then return redis.error_reply('site_feedback: no mode ' .. mode) end
local a = {}  -- the mode's arguments, by name
for i, name in ipairs(MODE_ARGUMENTS[mode]) do a[name] = tonumber(ARGV[3 + i]) end

-- The site's leases ever taken, and those that ended: its responses.
local function counted()
    local leased = tonumber(redis.call('HGET', key, 'leased') or '0') or 0  -- text: none
    local held = redis.pcall('ZCOUNT', KEYS[3], now, '+inf')
    return leased, leased - (type(held) == 'number' and held or 0)
end

-- The lease's interval: the slowdown's or AutoThrottle's, the longer; written if it moved.
local function set_delay(slow)
    local delay = math.floor(math.max(s.throttle or 0, slow))
    if delay == (s.delay or 0) then return end
    s.delay = delay
    if delay > 0 then redis.call('HSET', key, 'delay', delay) else redis.call('HDEL', key, 'delay') end
end

-- The slowdown's interval now: it halves every `recovery` ms, and ends below 1 ms.
local function recover()
    if not s.slow then return 0 end
    local slow = s.slow * 2 ^ (-(now - (s.slowed_at or now)) / math.max(1, recovery))
    if slow < 1 then
        s.slow, slow = nil, 0
        redis.call('HDEL', key, 'slow', 'slowed_at')
    end
    set_delay(slow)
    return slow
end

local function restart_window(from)
    s.win_at, s.win_from, s.win_errors, s.win_seen = now, from, 0, now
    redis.call('HSET', key, 'win_at', now, 'win_from', from, 'win_errors', 0, 'win_seen', now)
end

local function gate()
    local seen = s.win_seen or 0
    if now - seen > math.max(IDLE_MS, 4 * (s.delay or 0)) then
        local _, answered = counted()
        restart_window(answered)
    elseif now - seen > 1000 then
        redis.call('HSET', key, 'win_seen', now)
    end
end

local function backoff(given, first, longest, after, long_pause)
    strikes = strikes + 1
    local pause = given >= 0 and given or math.min(longest, first * 2 ^ (strikes - 1))
    if after > 0 and strikes >= after then pause = math.max(pause, long_pause) end
    local longer = math.max(0, now + pause - math.max(paused, now))  -- paused time it adds
    paused = math.max(paused, now + pause)
    redis.call('HSET', key, 'until', paused, 'strikes', strikes, 'backoff_at', now)
    count(key, 'backoffs', 1)
    count(key, 'paused_ms', longer)
    redis.call('SADD', KEYS[2], ARGV[1])
end

-- Overloaded: lease a share below the rate the other responses came at (never faster than
-- now), and count a new window from the leases taken so far (errors of those in flight then
-- are old news).
local function slow_down(n, errors, elapsed, share, slow, longest, leased)
    local served = math.max(1, n - errors) * (1 - share)
    local interval = math.min(longest, math.max(slow, 1, elapsed / served))
    s.slow = interval
    redis.call('HSET', key, 'slow', interval, 'slowed_at', now)
    count(key, 'slowdowns', 1)
    set_delay(interval)
    restart_window(leased)
    return math.floor(interval)
end

-- The window of the last `window` responses: older ones leave it pro rata, errors and time.
local function server_error(share, window, least, longest, slow)
    count(key, 'server_errors', 1)
    redis.call('SADD', KEYS[2], ARGV[1])
    local leased, answered = counted()
    local n = answered - (s.win_from or answered)
    if not s.win_at or n <= 0 then  -- no window yet, or an answer to a request leased before it
        if not s.win_at then restart_window(answered) end
        return 0
    end
    local errors, elapsed = math.min(n, (s.win_errors or 0) + 1), math.max(1, now - s.win_at)
    if n > window then
        errors, elapsed, n = errors * window / n, elapsed * window / n, window
    end
    if n >= least and errors > share * n then
        return slow_down(n, errors, elapsed, share, slow, longest, leased)
    end
    redis.call('HSET', key, 'win_errors', errors, 'win_from', answered - n, 'win_at', now - elapsed)
    return 0
end

local function throttle(latency, target, start, low, high, status)
    local delay = s.throttle or (not s.slow and s.delay) or start
    local wanted = latency / target
    local estimate = math.max(low, math.min(high, math.max(wanted, (delay + wanted) / 2)))
    if status == 200 or estimate > delay then
        s.throttle = math.floor(estimate)
        redis.call('HSET', key, 'throttle', s.throttle)
        redis.call('SADD', KEYS[2], ARGV[1])
    end
end

local slow, slowed = recover(), 0
if mode == 'gate' then
    gate()
elseif mode == 'backoff' then
    backoff(a.retry_after_ms, a.first_ms, a.longest_ms, a.pause_after, a.pause_ms)
elseif mode == 'error' then
    slowed = server_error(a.share, a.window, a.least, a.longest_ms, slow)
elseif mode == 'robots' then
    local delay = math.floor(a.crawl_delay_ms or 0)
    if delay > 0 then redis.call('HSET', key, 'robots', delay) else redis.call('HDEL', key, 'robots') end
    redis.call('SADD', KEYS[2], ARGV[1])
elseif mode == 'ok' then
    if strikes > 0 then
        strikes = 0
        redis.call('HSET', key, 'strikes', 0)
    end
    if a.latency_ms then
        throttle(a.latency_ms, a.target, a.start_ms, a.lowest_ms, a.highest_ms, a.status)
        set_delay(slow)
    end
end
return {math.max(0, paused - now), strikes, slowed}
