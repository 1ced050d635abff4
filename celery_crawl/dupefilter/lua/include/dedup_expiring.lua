-- Expiring exact dedup, for incremental crawls. Fills the dupefilter slot of
-- every script with one, and include/dedup_size.lua includes
-- it for the exporter's count; never run alone.
--
-- A fingerprint is remembered for at least the window after it was added, and
-- forgotten by the window plus one bucket width. Time, on the Redis server's
-- clock (TIME, so every worker shares one clock), is cut into buckets of width
-- w = ceil(window / buckets); time bucket t holds the fingerprints first added
-- during it. Layout under the dupefilter key D (one hash tag):
-- - D:expiring      hash: window_ms, width_ms and buckets, stored when the filter
--                   is created; afterwards the stored ones win;
-- - D:t:<t>:...     an exact bucketed set (include/bucketed_sets.lua) per time
--                   bucket t, with its count at D:t:<t>:count.
-- Every key of time bucket t expires at (t + 1) * w + window (PEXPIREAT), the
-- moment it stops being checked: memory is reclaimed whole, without a scan, and
-- a check looks only at the buckets still alive, t >= floor((now - window) / w).
-- A duplicate does not renew its fingerprint: the window counts from the add.
--
-- Uses: DEDUP_KEY, and two parameters from ARGV[DEDUP_ARGV] on: window_ms,
-- buckets. COUNT_KEY is not used: the count is the sum of the live buckets'.
-- Defines: DEDUP_KIND, dedup_add(fp), dedup_seen(fp), dedup_remove(fp) (true when
-- a live bucket held it), dedup_count(), dedup_config(),
-- dedup_each_key(visit) (calls visit on every key of the filter, returns the sum
-- of what it returns: dedup.lua clears and measures the filter with it), and
-- dedup_guard(spec, fps), which adds to a guard spec (include/keytypes.lua) the
-- keys dedup_add meets for each of fps (with fps empty, the geometry and the counts
-- every other function reads: a script calls it before it uses the filter), and
-- dedup_use(dedup_key, count_key), which points the functions at another
-- spider's filter of the same kind; dedup_source, dedup_crawl_start and
-- dedup_crawl_guard do nothing here (include/dedup_exact.lua tells why).
--!include bucketed_sets
--!include dedup_keys

local DEDUP_KIND = 'expiring' -- claimed in D:kind by the first process that opens the filter

local EXPIRING_KEY = expiring_key(DEDUP_KEY)
local expiring_cache = nil -- window, width and time buckets, read once per script run

local function expiring_geometry(create)
    local stored = redis.call('HMGET', EXPIRING_KEY, 'window_ms', 'width_ms')
    local window, width = tonumber(stored[1]), tonumber(stored[2])
    if window and width then return window, width end
    local buckets = tonumber(ARGV[DEDUP_ARGV + 1])
    window = tonumber(ARGV[DEDUP_ARGV])
    width = math.ceil(window / buckets)
    if create then
        redis.call('HSET', EXPIRING_KEY, 'window_ms', window, 'width_ms', width, 'buckets', buckets)
    end
    return window, width
end

local function expiring_base(t)
    return expiring_base_key(DEDUP_KEY, t)
end

-- The live time buckets before the current one that hold fingerprints, with
-- their newest generation: no add changes them within a script run.
local function expiring_older(oldest, current)
    local older = {}
    for t = oldest, current - 1 do
        local base = expiring_base(t)
        if redis.call('EXISTS', sets_count_key(base)) == 1 then
            older[#older + 1] = {base = base, last = sets_generation(sets_count_key(base))}
        end
    end
    return older
end

local function expiring_state(create)
    if expiring_cache then return expiring_cache end
    local window, width = expiring_geometry(create)
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local current = math.floor(now / width)
    local oldest = math.floor((now - window) / width)
    expiring_cache = {
        window = window,
        width = width,
        current = current,
        oldest = oldest,
        older = expiring_older(oldest, current),
        expire_at = (current + 1) * width + window,
    }
    return expiring_cache
end

local function expiring_in_older(state, fp)
    for _, bucket in ipairs(state.older) do
        if sets_member(bucket.base, fp, bucket.last) then return true end
    end
    return false
end

-- Returns true when fp was new (and records it), false when seen within the window.
local function dedup_add(fp)
    local state = expiring_state(true)
    if expiring_in_older(state, fp) then return false end
    local base = expiring_base(state.current)
    local key = sets_add(base, sets_count_key(base), fp)
    if not key then return false end
    redis.call('PEXPIREAT', key, string.format('%d', state.expire_at))
    redis.call('PEXPIREAT', sets_count_key(base), string.format('%d', state.expire_at))
    return true
end

local function dedup_seen(fp)
    local state = expiring_state(false)
    local base = expiring_base(state.current)
    return expiring_in_older(state, fp) or sets_contains(base, sets_count_key(base), fp)
end

local function dedup_remove(fp)
    local state = expiring_state(false)
    for t = state.oldest, state.current do
        local base = expiring_base(t)
        local removed = sets_remove(base, sets_count_key(base), fp)
        if removed then
            redis.call('PEXPIREAT', removed, string.format('%d', (t + 1) * state.width + state.window))
            return true
        end
    end
    return false
end

-- Sum of visit(key) over every key of the live time buckets, and the hash.
local function dedup_each_key(visit)
    local state, total = expiring_state(false), 0
    for t = state.oldest, state.current do
        local base = expiring_base(t)
        total = total + sets_each_key(base, sets_count_key(base), visit)
    end
    return total + visit(EXPIRING_KEY)
end

local function dedup_count()
    local state, total = expiring_state(false), 0
    for t = state.oldest, state.current do
        total = total + sets_size(sets_count_key(expiring_base(t)))
    end
    return total
end

local function dedup_config()
    expiring_state(true)
    return redis.call('HGETALL', EXPIRING_KEY)
end

-- The geometry hash first (numbers: a width of 0 or text would loop for good); the
-- live time buckets' keys only when it is sound (their range follows it; else the
-- hash is refused). With no fps: their counts, which every other function reads.
local function dedup_guard(spec, fps)
    spec_add(spec, EXPIRING_KEY, 'numbers')
    if key_type_problem({EXPIRING_KEY, 'numbers'}) then return end
    local window, width = expiring_geometry(false)
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    for t = math.floor((now - window) / width), math.floor(now / width) do
        local base = expiring_base(t)
        sets_guard(spec, base, sets_count_key(base), fps)
    end
end

local function dedup_use(dedup_key, count_key)
    DEDUP_KEY, COUNT_KEY = dedup_key, count_key
    EXPIRING_KEY, expiring_cache = expiring_key(dedup_key), nil
end

-- Hit-expiring filters' hooks (include/dedup_hits.lua): this kind has no sources.
local function dedup_source(_) end
local function dedup_crawl_start(_) end
local function dedup_crawl_guard(_) end
