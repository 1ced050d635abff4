-- The size of a spider's dedup filter, whatever its kind, read without its
-- parameters: for tools/lua/spider_size.lua (the exporter); never run alone.
--
-- A kind counts its fingerprints at COUNT_KEY (exact: the exact count; bloom: the
-- fingerprints it took as new) unless its size is its own ("own" in
-- celery_crawl.dupefilter.filters.KINDS): then its fragment is included here, and
-- a filter whose stored parameters exist is measured by its dedup_count(), over
-- those parameters (no ARGV needed).
--
-- Uses: DEDUP_KEY, COUNT_KEY and DEDUP_ARGV of the including script (DEDUP_ARGV past
-- the end of ARGV: the stored parameters are read, never created).
-- Defines: dedup_size_guard(spec), which adds to a guard spec (include/keytypes.lua)
-- the keys dedup_size reads beside the count, and dedup_size(), the number of
-- fingerprints; nil when the count is not a number (a Lua nil ends a reply's table).
--!include dedup_expiring

local function dedup_size_own()
    return redis.call('EXISTS', EXPIRING_KEY) == 1
end

local function dedup_size_guard(spec)
    if dedup_size_own() then dedup_guard(spec, {}) end
end

local function dedup_size()
    if dedup_size_own() then return dedup_count() end
    return tonumber(redis.call('GET', COUNT_KEY) or '0')
end
