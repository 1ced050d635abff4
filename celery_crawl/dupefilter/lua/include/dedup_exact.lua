-- Exact dedup on bucketed sets. Fills the dupefilter slot of every script with
-- one; never run alone.
--
-- The fingerprints are one bucketed set (include/bucketed_sets.lua has the
-- layout) under the dupefilter key, with their exact count at COUNT_KEY.
--
-- Uses: DEDUP_KEY (the dupefilter key), COUNT_KEY (exact count of fingerprints);
-- no parameters (DEDUP_ARGV is ignored).
-- Defines: DEDUP_KIND, dedup_add(fp), dedup_seen(fp), dedup_remove(fp) (true when
-- it was there), dedup_count(), dedup_config(),
-- dedup_each_key(visit) (calls visit on every key of the filter, returns the sum
-- of what it returns: dedup.lua clears and measures the filter with it), and
-- dedup_guard(spec, fps), which adds to a guard spec (include/keytypes.lua) the
-- keys dedup_add meets for each of fps, and
-- dedup_use(dedup_key, count_key), which points the functions at another
-- spider's filter of the same kind; and dedup_source(source),
-- dedup_crawl_start(source) and dedup_crawl_guard(spec), which count a source's
-- crawls apart in a kind that does (include/dedup_hits.lua) and do nothing here.
-- Every fragment defines all of these: the scripts with the slot call them.
--!include bucketed_sets

local DEDUP_KIND = 'exact' -- claimed in D:kind by the first process that opens the filter

-- Returns true when fp was new (and records it), false when already seen.
local function dedup_add(fp)
    return sets_add(DEDUP_KEY, COUNT_KEY, fp) ~= nil
end

local function dedup_seen(fp)
    return sets_contains(DEDUP_KEY, COUNT_KEY, fp)
end

local function dedup_remove(fp)
    return sets_remove(DEDUP_KEY, COUNT_KEY, fp) ~= nil
end

local function dedup_count()
    return sets_size(COUNT_KEY)
end

local function dedup_config()
    return {}
end

local function dedup_each_key(visit)
    return sets_each_key(DEDUP_KEY, COUNT_KEY, visit)
end

local function dedup_guard(spec, fps)
    sets_guard(spec, DEDUP_KEY, COUNT_KEY, fps)
end

local function dedup_use(dedup_key, count_key)
    DEDUP_KEY, COUNT_KEY = dedup_key, count_key
end

-- Hit-expiring filters' hooks (include/dedup_hits.lua): this kind has no sources.
local function dedup_source(_) end
local function dedup_crawl_start(_) end
local function dedup_crawl_guard(_) end
