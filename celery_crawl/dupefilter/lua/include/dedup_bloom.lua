-- Scalable bloom filter on plain bitmaps, no Redis module needed. Fills the
-- dupefilter slot of every script with one; never run alone.
--
-- Layout, all under the dupefilter key D (one hash tag, so one cluster slot):
-- - D:bloom       hash: the parameters the filter was created with (capacity,
--                 error_rate, growth, tightening, max_bits), the number of
--                 sub-filters (filters), and each sub-filter's geometry, fixed
--                 when it is created (bits:<i>, k:<i>, capacity:<i>), so that
--                 every process agrees on it whatever its own settings say;
-- - D:bloom:<i>   string: the bits of sub-filter i, allocated whole at creation;
-- - COUNT_KEY     the fingerprints recorded as new (an estimate of the size).
--
-- Sub-filter i holds capacity * growth^i fingerprints at a false-positive
-- rate of error_rate * (1 - tightening) * tightening^i, so the rates of all
-- sub-filters, however many, sum to less than error_rate. A sub-filter never
-- has more than max_bits bits (a string stays below 512 MB); a capped one
-- holds fewer fingerprints at the same rate. Only the newest sub-filter takes
-- new fingerprints; a new one opens when the count reaches their total
-- capacity. The k bit positions come from one SHA-1 of the fingerprint by
-- enhanced double hashing (Dillinger and Manolios): two 52-bit halves h1, h2,
-- then x = h1 mod m, y = h2 mod m, and per probe x += y, y += i (mod m).
-- Every value stays below 2^53, so Lua's doubles hold it exactly.
--
-- Includes keytypes. Uses: DEDUP_KEY, COUNT_KEY, and five parameters from ARGV[DEDUP_ARGV] on:
-- capacity, error_rate, growth, tightening, max_bits. They are stored when the
-- filter is created; afterwards the stored ones win.
-- Defines: DEDUP_KIND, dedup_add(fp), dedup_seen(fp), dedup_remove(fp) (always
-- false: a bit may be shared by other fingerprints, so none can be cleared),
-- dedup_count(), dedup_config(),
-- dedup_each_key(visit) (calls visit on every key of the filter, returns the sum
-- of what it returns: dedup.lua clears and measures the filter with it), and
-- dedup_guard(spec, fps), which adds to a guard spec (include/keytypes.lua) the
-- keys dedup_add meets (with fps empty, the count and parameters every function
-- reads: a script calls it before it uses the filter at all), and
-- dedup_use(dedup_key, count_key), which points the functions at another
-- spider's filter of the same kind; dedup_source, dedup_crawl_start and
-- dedup_crawl_guard do nothing here (include/dedup_exact.lua tells why).
local DEDUP_KIND = 'bloom' -- claimed in D:kind by the first process that opens the filter
--!include keytypes
--!include dedup_keys

local BLOOM_KEY = bloom_key(DEDUP_KEY)
local BLOOM_PARAMS = {'capacity', 'error_rate', 'growth', 'tightening', 'max_bits'}
local LN2 = math.log(2)
local BLOOM_MAX_FILTERS = 64  -- sub-filters a guard looks at
local bloom_cache = nil -- the filter's state, read once per script run

local function bloom_filter(config, i)
    return {
        key = bloom_filter_key(BLOOM_KEY, i),
        bits = tonumber(config['bits:' .. i]),
        k = tonumber(config['k:' .. i]),
        capacity = tonumber(config['capacity:' .. i]),
    }
end

-- Sub-filter i: its geometry in the hash, its bits allocated (exactly, by
-- SETRANGE on a new key) rather than grown.
local function bloom_grow(state)
    local config, i = state.config, #state.filters
    local rate = config.error_rate * (1 - config.tightening) * config.tightening ^ i
    local bits_per_fp = -math.log(rate) / (LN2 * LN2)
    local capacity = math.floor(config.capacity * config.growth ^ i)
    local bits = math.ceil(capacity * bits_per_fp / 8) * 8
    if bits > config.max_bits then
        bits = math.floor(config.max_bits / 8) * 8
        capacity = math.max(1, math.floor(bits / bits_per_fp))
    end
    local k = math.max(1, math.floor(bits_per_fp * LN2 + 0.5))
    local filter = {key = bloom_filter_key(BLOOM_KEY, i), bits = bits, k = k, capacity = capacity}
    redis.call('DEL', filter.key)
    redis.call('SETRANGE', filter.key, bits / 8 - 1, '\0')
    redis.call('HSET', BLOOM_KEY, 'bits:' .. i, bits, 'k:' .. i, k,
        'capacity:' .. i, capacity, 'filters', i + 1)
    state.filters[i + 1] = filter
    state.capacity = state.capacity + capacity
end

local function bloom_read_config()
    local flat = redis.call('HGETALL', BLOOM_KEY)
    local config = {}
    for i = 1, #flat, 2 do config[flat[i]] = flat[i + 1] end
    return config
end

local function bloom_create_config()
    local fields = {}
    for j, name in ipairs(BLOOM_PARAMS) do
        fields[#fields + 1] = name
        fields[#fields + 1] = ARGV[DEDUP_ARGV + j - 1]
    end
    redis.call('HSET', BLOOM_KEY, 'filters', 0, unpack(fields))
    return bloom_read_config()
end

-- The filter's state; created from the parameters in ARGV when missing,
-- unless create is false (then nil).
local function bloom_state(create)
    if bloom_cache then return bloom_cache end
    local config = bloom_read_config()
    if config.filters == nil then
        if not create then return nil end
        config = bloom_create_config()
    end
    for _, name in ipairs(BLOOM_PARAMS) do config[name] = tonumber(config[name]) end
    local state = {config = config, filters = {}, capacity = 0}
    for i = 0, tonumber(config.filters) - 1 do
        state.filters[i + 1] = bloom_filter(config, i)
        state.capacity = state.capacity + state.filters[i + 1].capacity
    end
    state.count = tonumber(redis.call('GET', COUNT_KEY) or '0')
    if #state.filters == 0 then bloom_grow(state) end
    bloom_cache = state
    return state
end

local function bloom_hashes(fp)
    local hex = redis.sha1hex(fp)
    return tonumber(string.sub(hex, 1, 13), 16), tonumber(string.sub(hex, 14, 26), 16)
end

-- BITFIELD arguments that GET (or SET to 1) the fingerprint's k bits in filter.
local function bloom_ops(h1, h2, filter, set)
    local bits, args = filter.bits, {}
    local x, y = math.fmod(h1, bits), math.fmod(h2, bits)
    for i = 1, filter.k do
        if set then
            args[#args + 1], args[#args + 2], args[#args + 3], args[#args + 4] = 'SET', 'u1', x, 1
        else
            args[#args + 1], args[#args + 2], args[#args + 3] = 'GET', 'u1', x
        end
        x = math.fmod(x + y, bits)
        y = math.fmod(y + i, bits)
    end
    return args
end

local function bloom_all_set(bits)
    for _, bit in ipairs(bits) do
        if bit == 0 then return false end
    end
    return true
end

local function bloom_in(filter, h1, h2)
    local ops = bloom_ops(h1, h2, filter, false)
    return bloom_all_set(redis.call('BITFIELD_RO', filter.key, unpack(ops)))
end

-- Returns true when fp was new (and records it), false when seen (or a false positive).
local function dedup_add(fp)
    local state = bloom_state(true)
    if state.count >= state.capacity then bloom_grow(state) end
    local h1, h2 = bloom_hashes(fp)
    local last = #state.filters
    for i = 1, last - 1 do
        if bloom_in(state.filters[i], h1, h2) then return false end
    end
    local old = redis.call('BITFIELD', state.filters[last].key,
        unpack(bloom_ops(h1, h2, state.filters[last], true)))
    if bloom_all_set(old) then return false end
    redis.call('INCR', COUNT_KEY)
    state.count = state.count + 1
    return true
end

local function dedup_seen(fp)
    local state = bloom_state(false)
    if not state then return false end
    local h1, h2 = bloom_hashes(fp)
    for _, filter in ipairs(state.filters) do
        if bloom_in(filter, h1, h2) then return true end
    end
    return false
end

local function dedup_remove(fp)
    return false
end

local function dedup_count()
    return tonumber(redis.call('GET', COUNT_KEY) or '0')
end

local function dedup_config()
    bloom_state(true)
    return redis.call('HGETALL', BLOOM_KEY)
end

local function dedup_each_key(visit)
    local total = visit(COUNT_KEY)
    local state = bloom_state(false)
    for _, filter in ipairs(state and state.filters or {}) do
        total = total + visit(filter.key)
    end
    return total + visit(BLOOM_KEY)
end

-- The count, the parameters hash (every value a number: they are divided by and looped
-- over), and (when that is sound) each sub-filter's bits. With no fps: the keys every
-- other function reads.
local function dedup_guard(spec, fps)
    spec_add(spec, COUNT_KEY, 'counter')
    spec_add(spec, BLOOM_KEY, 'numbers')
    if #fps == 0 or key_type_problem({BLOOM_KEY, 'numbers'}) then return end
    local filters = tonumber(redis.call('HGET', BLOOM_KEY, 'filters')) or 0
    for i = 0, math.min(filters, BLOOM_MAX_FILTERS) - 1 do
        spec_add(spec, bloom_filter_key(BLOOM_KEY, i), 'string')
    end
end

local function dedup_use(dedup_key, count_key)
    DEDUP_KEY, COUNT_KEY = dedup_key, count_key
    BLOOM_KEY, bloom_cache = bloom_key(dedup_key), nil
end

-- Hit-expiring filters' hooks (include/dedup_hits.lua): this kind has no sources.
local function dedup_source(_) end
local function dedup_crawl_start(_) end
local function dedup_crawl_guard(_) end
