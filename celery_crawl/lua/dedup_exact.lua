-- Exact dedup on bucketed sets: included by enqueue.lua, never run alone.
--
-- Fingerprints (binary digests) are spread over small sets that Redis keeps
-- listpack-encoded, about 22 bytes a fingerprint instead of about 42 in one
-- big set. Generation g has 2^(7+g) buckets and holds up to 64 * 2^(7+g)
-- fingerprints; a new generation opens when the older ones are full, so a
-- check looks at one bucket per generation (log2 of the size).
--
-- Uses: DEDUP_KEY (the dupefilter key), COUNT_KEY (exact count of fingerprints).
-- Defines: dedup_add(fp), dedup_clear(), dedup_memory().

local BASE_BITS = 7
local PER_BUCKET = 64

local function dedup_generation(count)
    local generation, capacity = 0, PER_BUCKET * 2 ^ BASE_BITS
    while count >= capacity do
        generation = generation + 1
        capacity = capacity + PER_BUCKET * 2 ^ (BASE_BITS + generation)
    end
    return generation
end

local function dedup_bucket(fp, generation)
    local b1, b2, b3 = string.byte(fp, 1, 3)
    local top24 = (b1 or 0) * 65536 + (b2 or 0) * 256 + (b3 or 0)
    local bucket = math.floor(top24 / 2 ^ (24 - BASE_BITS - generation))
    return DEDUP_KEY .. ':' .. generation .. ':' .. bucket
end

-- Returns true when fp was new (and records it), false when already seen.
local function dedup_add(fp)
    local current = dedup_generation(tonumber(redis.call('GET', COUNT_KEY) or '0'))
    for generation = 0, current - 1 do
        if redis.call('SISMEMBER', dedup_bucket(fp, generation), fp) == 1 then
            return false
        end
    end
    if redis.call('SADD', dedup_bucket(fp, current), fp) == 0 then
        return false
    end
    redis.call('INCR', COUNT_KEY)
    return true
end

local function dedup_each_key(visit)
    local total = visit(COUNT_KEY)
    local last = dedup_generation(tonumber(redis.call('GET', COUNT_KEY) or '0'))
    for generation = 0, last do
        for bucket = 0, 2 ^ (BASE_BITS + generation) - 1 do
            total = total + visit(DEDUP_KEY .. ':' .. generation .. ':' .. bucket)
        end
    end
    return total
end

local function dedup_clear()
    return dedup_each_key(function(key) return redis.call('DEL', key) end)
end

local function dedup_memory()
    return dedup_each_key(function(key) return redis.call('MEMORY', 'USAGE', key, 'SAMPLES', 0) or 0 end)
end
