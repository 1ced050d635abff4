-- Exact fingerprint sets, bucketed: included, never run alone.
--
-- Fingerprints (binary digests) are spread over small sets that Redis keeps
-- listpack-encoded, about 23 bytes a fingerprint instead of about 42 in one
-- big set. Generation g has 2^(7+g) buckets and holds up to 64 * 2^(7+g)
-- fingerprints; a new generation opens when the older ones are full, so a
-- check looks at one bucket per generation (log2 of the size).
--
-- A set of fingerprints lives under a base key B with its exact count at
-- COUNT: bucket b of generation g is the set sets_bucket_key(B, g, b).
-- Uses: nothing from the including script. Includes keytypes and dedup_keys.
-- COUNT counts the fingerprints ever added: the generations follow it, so it
-- never goes down. The ones removed since are counted at sets_removed_key(COUNT).
-- Defines: sets_add(base, count_key, fp), sets_contains(base, count_key, fp),
-- sets_remove(base, count_key, fp), sets_size(count_key),
-- sets_each_key(base, count_key, visit); and for callers that check one set
-- many times in a script run, sets_generation(count_key) (the newest
-- generation) and sets_member(base, fp, last) (is fp in generations 0..last);
-- sets_guard(spec, base, count_key, fps): the keys sets_add and sets_remove meet for
-- each of fps, and the counts every function reads, added to a guard spec
-- (include/keytypes.lua).
--!include keytypes
--!include dedup_keys

local SETS_BASE_BITS = 7
local SETS_PER_BUCKET = 64
local SETS_MAX_GENERATIONS = 40  -- 2^47 buckets: no count reaches it; a count of 1e400 stops here

local function sets_generation_of(count)
    local generation, capacity = 0, SETS_PER_BUCKET * 2 ^ SETS_BASE_BITS
    while count >= capacity and generation < SETS_MAX_GENERATIONS do
        generation = generation + 1
        capacity = capacity + SETS_PER_BUCKET * 2 ^ (SETS_BASE_BITS + generation)
    end
    return generation
end

local function sets_generation(count_key)
    return sets_generation_of(tonumber(redis.call('GET', count_key) or '0'))
end

local function sets_bucket(base, fp, generation)
    local b1, b2, b3 = string.byte(fp, 1, 3)
    local top24 = (b1 or 0) * 65536 + (b2 or 0) * 256 + (b3 or 0)
    local bucket = math.floor(top24 / 2 ^ (24 - SETS_BASE_BITS - generation))
    return sets_bucket_key(base, generation, bucket)
end

local function sets_member(base, fp, last)
    for generation = 0, last do
        if redis.call('SISMEMBER', sets_bucket(base, fp, generation), fp) == 1 then
            return true
        end
    end
    return false
end

-- The count first, then fp's bucket in every generation: those follow the count,
-- so they are looked at only when it holds a number (else the count is refused).
local function sets_guard(spec, base, count_key, fps)
    spec_add(spec, count_key, 'counter')
    spec_add(spec, sets_removed_key(count_key), 'counter')  -- sets_remove, sets_size
    local held = redis.pcall('GET', count_key)  -- pcall: the count may be of another type
    if type(held) == 'table' or (held and not string.match(held, '^%-?%d+$')) then return end
    local count = tonumber(held or '0')
    local last = sets_generation_of(count)
    for _, fp in ipairs(fps) do
        for generation = 0, last do spec_add(spec, sets_bucket(base, fp, generation), 'set') end
    end
end

-- Records fp when it is new and returns the set it went into; nil when seen.
local function sets_add(base, count_key, fp)
    local current = sets_generation(count_key)
    if sets_member(base, fp, current - 1) then return nil end
    local key = sets_bucket(base, fp, current)
    if redis.call('SADD', key, fp) == 0 then return nil end
    redis.call('INCR', count_key)
    return key
end

local function sets_contains(base, count_key, fp)
    return sets_member(base, fp, sets_generation(count_key))
end

-- Forgets fp; returns the key of the removed-count when it was there, else nil.
local function sets_remove(base, count_key, fp)
    for generation = 0, sets_generation(count_key) do
        if redis.call('SREM', sets_bucket(base, fp, generation), fp) == 1 then
            redis.call('INCR', sets_removed_key(count_key))
            return sets_removed_key(count_key)
        end
    end
    return nil
end

-- The number of fingerprints held: added, less removed.
local function sets_size(count_key)
    local counts = redis.call('MGET', count_key, sets_removed_key(count_key))
    return tonumber(counts[1] or '0') - tonumber(counts[2] or '0')
end

-- Sum of visit(key) over the count key and every bucket the sets may use.
local function sets_each_key(base, count_key, visit)
    local last = sets_generation(count_key)
    local total = visit(count_key) + visit(sets_removed_key(count_key))
    for generation = 0, last do
        for bucket = 0, 2 ^ (SETS_BASE_BITS + generation) - 1 do
            total = total + visit(sets_bucket_key(base, generation, bucket))
        end
    end
    return total
end
