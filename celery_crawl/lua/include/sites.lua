-- Per-site politeness: included, never run alone.
--
-- A queue entry may carry its site (entry_site, include/jobs.lua): the key its
-- request counts against (the URL's host by default). For a queue Q, a site s has:
--   Q:site:s        hash: inflight (its leases held now), tat (ms: when the next
--                   lease is due, GCRA), until (ms: paused before then: Retry-After,
--                   back-off), delay (ms: the shared AutoThrottle interval, 0 none),
--                   strikes (back-offs in a row), and counters for status: leased,
--                   backoffs, parked (entries that had to wait), waited_ms
--   Q:site:s:q      sorted set of the priority levels of its parked entries, and
--   Q:site:s:q:<p>  a list per level: entries that may not be leased yet, set aside
--                   so that the queue behind them keeps flowing
-- and the queue has:
--   Q:site:~parked  sorted set: sites with parked entries, score = when they may
--                   take one more (ms; far ahead while at the concurrency cap: an
--                   ack brings it forward)
--   Q:site:~known   set of the sites with limits seen (status, clear)
--   Q:site:~limits  hash: site -> "concurrency interval_ms tolerance_ms", the limits of
--                   named sites over the defaults the lease script is given
-- A lease of a limited site has its lease id's top bit set: every script that ends
-- a lease (ack, requeue) gives the site its slot back (site_release).
--
-- Uses: nothing from the including script. Includes entries.
-- Defines: site_key, site_parked_length, site_delete_all, site_release, site_front, and
-- the lease script's site_parse_limits, site_wait_ms, site_take, site_ready_at.

--!include entries

local AT_CAP_MS = 60000  -- a site at its cap is looked at again at the latest after this

local function site_key(levels, site)
    return levels .. ':site:' .. site
end

-- The parked entries of every site of the queue.
local function site_parked_length(levels)
    local total = 0
    for _, site in ipairs(redis.call('ZRANGE', levels .. ':site:~parked', 0, -1)) do
        local q = site_key(levels, site) .. ':q'
        for _, level in ipairs(redis.call('ZRANGE', q, 0, -1)) do
            total = total + redis.call('LLEN', q .. ':' .. level)
        end
    end
    return total
end

-- Delete every site's state and parked entries; returns the number of keys deleted.
local function site_delete_all(levels)
    local prefix, deleted = levels .. ':site:', 0
    for _, site in ipairs(redis.call('SMEMBERS', prefix .. '~known')) do
        local q = prefix .. site .. ':q'
        for _, level in ipairs(redis.call('ZRANGE', q, 0, -1)) do
            deleted = deleted + redis.call('DEL', q .. ':' .. level)
        end
        deleted = deleted + redis.call('DEL', prefix .. site, q)
    end
    return deleted + redis.call('DEL', prefix .. '~parked', prefix .. '~known', prefix .. '~limits')
end

-- A lease member (8-byte lease id, 4-byte priority, entry) is no longer held:
-- its site, if counted, gets its slot back, and may lease again at once.
-- Returns true when a site with parked entries was freed (the caller wakes a pop).
local function site_release(levels, member)
    if (string.byte(member, 1) or 0) < 128 then return false end
    local site = entry_site(member, 13)
    if not site then return false end
    local key = site_key(levels, site)
    if redis.call('HINCRBY', key, 'inflight', -1) < 0 then redis.call('HSET', key, 'inflight', 0) end
    local parked = levels .. ':site:~parked'
    local now = redis.call('TIME')
    return redis.call('ZADD', parked, 'XX', 'LT', 'CH', now[1] * 1000 + math.floor(now[2] / 1000),
        site) == 1
end

-- Limits: {concurrency cap (0 none), interval ms (0 none), burst}, from "c interval burst".
local function site_parse_limits(text)
    local cap, interval, burst = string.match(text, '^(%d+) ([%d.]+) (%d+)$')
    if not cap then return nil end
    return {tonumber(cap), tonumber(interval), math.max(1, tonumber(burst))}
end

-- Milliseconds until the site may take one more lease: 0 now, -1 at its cap.
local function site_wait_ms(state, limits, now)
    if state.paused > now then return state.paused - now end
    local interval = math.max(limits[2], state.delay)
    local due = state.tat - interval * (limits[3] - 1)
    if interval > 0 and due > now then return due - now end
    if limits[1] > 0 and state.inflight >= limits[1] then return -1 end
    return 0
end

-- The site takes one lease now; true when the lease counts against its cap.
local function site_take(state, limits, now)
    state.tat = math.max(state.tat, now) + math.max(limits[2], state.delay)
    state.leased = state.leased + 1
    state.dirty = true
    if limits[1] > 0 then
        state.inflight = state.inflight + 1
        return true
    end
    return false
end

-- When the site may take one more lease (ms), for the parked index.
local function site_ready_at(state, limits, now)
    local wait = site_wait_ms(state, limits, now)
    return wait < 0 and now + AT_CAP_MS or now + wait
end

-- Where a lease handed back goes: the queue levels, or its site's parked levels
-- when entries of the site are parked (it then keeps its place before them).
local function site_front(levels, member)
    local site = entry_site(member, 13)
    if site and redis.call('ZSCORE', levels .. ':site:~parked', site) then
        return site_key(levels, site) .. ':q'
    end
    return levels
end
