-- Per-site politeness: included, never run alone.
--
-- A queue entry may carry its site (entry_site, include/entries.lua): the key its
-- request counts against (the URL's host by default). A site's state belongs to the
-- spider group (every spider of the group crawls under the same limits); its
-- prefix S is the group's site prefix, '<prefix>:{group}:site:' (SpiderKeys.site_prefix,
-- passed in KEYS by each script; a site's keys are derived from it, the sites an
-- entry names being known only inside the script):
--   S .. site            hash: tat (ms: when the next lease is due, GCRA), until (ms:
--                        paused before then: Retry-After, back-off), delay (ms: the shared
--                        AutoThrottle interval), robots (ms: its robots.txt Crawl-delay,
--                        politeness/robots.py), strikes (back-offs in a row), backoff_at,
--                        and counters for status: leased, backoffs, parked (entries that
--                        had to wait), paused_ms (time paused by back-offs)
--   S .. site .. ':leases'  sorted set of the site's leases held now (member: lease id ..
--                        queue key, score: lease deadline ms). Counted from the deadline
--                        on, so a lease lost any way (a cleared queue, a restart) stops
--                        counting once its deadline passes; renewed with the lease.
--   S .. site .. ':waiting'  set of the queues (their keys) with entries of the site parked:
--                        a freed slot brings the site forward in each, and wakes its pops
--   S .. '~known'        set of the sites seen
--   S .. '~limits'       hash: site -> "concurrency interval_ms burst", over the defaults
-- Entries that may not be leased yet are parked, per queue Q:
--   Q:parked             sorted set: sites with parked entries, score = when they may
--                        take one more (ms; at the cap, when a lease ends: site_release)
--   Q:parked:site        sorted set of the priority levels of its parked entries, and
--   Q:parked:site:<p>    a list per level, in the queue's order
-- A lease of a site with a cap has its lease id's top bit set: every script that ends
-- or renews a lease (ack, requeue, extend) finds it in the site's leases.
--
-- Uses: nothing from the including script. Includes entries and keys (the key names).
-- Defines: site_parked_length, site_parked_delete,
-- site_release, site_parked_first, site_parked_none, site_renew, site_front, and for the lease script site_parse_limits,
-- site_wait_ms, site_take, site_ready_at.

--!include entries
--!include keys

local AT_CAP_MS = 60000  -- a site at its cap waits for a release, or at most this long

-- The parked entries of every site of the queue.
local function site_parked_length(levels)
    local total = 0
    for _, site in ipairs(redis.call('ZRANGE', parked_key(levels), 0, -1)) do
        local q = site_parked_key(levels, site)
        for _, level in ipairs(redis.call('ZRANGE', q, 0, -1)) do
            total = total + redis.call('LLEN', level_key(q, level))
        end
    end
    return total
end

-- Delete the queue's parked entries; returns the number of keys deleted. The sites'
-- state stays: their leases stop counting at their deadlines.
local function site_parked_delete(sites, levels)
    local deleted = 0
    for _, site in ipairs(redis.call('ZRANGE', parked_key(levels), 0, -1)) do
        redis.call('SREM', site_waiting_key(sites, site), levels)
        local q = site_parked_key(levels, site)
        for _, level in ipairs(redis.call('ZRANGE', q, 0, -1)) do
            deleted = deleted + redis.call('DEL', level_key(q, level))
        end
        deleted = deleted + redis.call('DEL', q)
    end
    return deleted + redis.call('DEL', parked_key(levels))
end

-- A lease's member in its site's leases: its lease id, and the queue it is of.
local function site_lease_tag(levels, member)
    return string.sub(member, 1, 8) .. levels
end

local function site_counted(member)
    return (string.byte(member, 1) or 0) >= 128 and entry_site(member, 13)
end

-- A lease member (8-byte lease id, 4-byte priority, entry) is no longer held: its
-- site, if it counts it, gets the slot back and may lease again at once, in every
-- queue of the group that has entries of it parked (their pops are woken).
local function site_release(sites, levels, member)
    local site = site_counted(member)
    if not site then return end
    redis.call('ZREM', site_leases_key(sites, site), site_lease_tag(levels, member))
    local waiting = redis.call('SMEMBERS', site_waiting_key(sites, site))
    if #waiting == 0 then return end
    local clock = redis.call('TIME')
    local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
    for _, queue in ipairs(waiting) do
        if redis.call('ZADD', parked_key(queue), 'XX', 'LT', 'CH', now, site) == 1 then
            redis.call('RPUSH', signal_key(queue), 1)
            redis.call('LTRIM', signal_key(queue), -64, -1)
            redis.pcall('PUBLISH', signal_key(queue), 1)  -- a notice; never fails the script
        end
    end
end

-- The site's entries parked in the queue: the first, or none left.
local function site_parked_first(sites, levels, site)
    redis.call('SADD', site_waiting_key(sites, site), levels)
end

local function site_parked_none(sites, levels, site)
    redis.call('ZREM', parked_key(levels), site)
    redis.call('SREM', site_waiting_key(sites, site), levels)
end

-- A lease renewed until deadline: its site keeps counting it.
local function site_renew(sites, levels, member, deadline)
    local site = site_counted(member)
    if site then
        redis.call('ZADD', site_leases_key(sites, site), 'XX', deadline, site_lease_tag(levels, member))
    end
end

-- Where a lease handed back goes: the queue levels, or its site's parked levels
-- when entries of the site are parked (it then keeps its place before them).
local function site_front(levels, member)
    local site = entry_site(member, 13)
    if site and redis.call('ZSCORE', parked_key(levels), site) then
        return site_parked_key(levels, site)
    end
    return levels
end

-- Limits: {concurrency cap (0 none), interval ms (0 none), burst}, from "c interval burst".
local function site_parse_limits(text)
    local cap, interval, burst = string.match(text, '^(%d+) ([%d.]+) (%d+)$')
    if not cap then return nil end
    return {tonumber(cap), tonumber(interval), math.max(1, tonumber(burst))}
end

-- The ms between the site's leases, and its burst: the limits' interval, the shared
-- delay (slowdown, AutoThrottle), or its robots.txt Crawl-delay, the longest. A site
-- with a Crawl-delay allows no burst: never two requests closer than the delay.
local function site_spacing(state, limits)
    local interval = math.max(limits[2], state.delay, state.robots)
    if state.robots > 0 then return interval, 1 end
    return interval, limits[3]
end

-- Milliseconds until the site may take one more lease: 0 now, -1 at its cap.
local function site_wait_ms(state, limits, now)
    if state.paused > now then return state.paused - now end
    local interval, burst = site_spacing(state, limits)
    local due = state.tat - interval * (burst - 1)
    if interval > 0 and due > now then return due - now end
    if limits[1] > 0 and state.inflight >= limits[1] then return -1 end
    return 0
end

-- The site takes one lease now; true when the lease counts against its cap.
local function site_take(state, limits, now)
    state.tat = math.max(state.tat, now) + (site_spacing(state, limits))
    state.leased = state.leased + 1
    state.dirty = true
    if limits[1] > 0 then
        state.inflight = state.inflight + 1
        return true
    end
    return false
end

-- When the site may take one more lease (ms), for the parked index: at its cap, when
-- its first lease would stop counting (a release comes sooner, or a renewal moves it on).
-- taken_until: the deadline of leases taken in this call, not yet in the site's leases.
local function site_ready_at(sites, site, state, limits, now, taken_until)
    local wait = site_wait_ms(state, limits, now)
    if wait >= 0 then return now + wait end
    local first = redis.call('ZRANGE', site_leases_key(sites, site), 0, 0, 'WITHSCORES')[2]
    local expires = first and math.min(tonumber(first), taken_until) or taken_until
    return math.min(now + AT_CAP_MS, expires + 1)
end
