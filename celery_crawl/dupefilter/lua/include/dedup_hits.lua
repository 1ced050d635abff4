-- Hit-expiring exact dedup, for recrawls of sources whose pages scroll away (a
-- forum's rolling listing). Fills the dupefilter slot of every
-- script with one; never run alone.
--
-- A fingerprint is forgotten once N crawls of its source in a row did not meet it:
-- a page that a crawl links again (a hit) is kept, one no longer linked is dropped
-- N crawls later, whatever the time between crawls. A crawl is a job with the
-- spider dedup scope; its source is the job's field `source` (a source of the
-- producer's schedule), or '-' for a job without one and for requests of no job.
-- Layout under the dupefilter key D (one hash tag):
-- - D:hits          hash: crawls (N), stored when the filter is created; afterwards
--                   the stored one wins;
-- - D:crawls        hash: source -> the number of its crawls started (its crawl c); a
--                   field that is not a number counts as 0 and is rewritten;
-- - D:h:<s>:<c>     a set per crawl c of source s: the fingerprints last met in it
--                   (one plain set: Redis keeps it compact, about 22 bytes a
--                   fingerprint, up to set-max-listpack-entries, 128 by default);
-- - COUNT_KEY       the fingerprints of every source, live.
-- A source's live crawls are c - N .. c. A fingerprint met again moves into the
-- current crawl's set; when crawl c + 1 starts (dedup_crawl_start), crawl c - N's set
-- is deleted whole: what no crawl since has met. Each source's fingerprints are its
-- own: two sources that link one page each fetch it once. A crawl counts as it
-- starts, whatever it finds: N crawls of a site that is down forget its pages.
-- With a group's vertical split, a job's requests routed to another spider meet that
-- spider's filter, for the job's source: job_start.lua starts the crawl in the
-- filter of every spider of the group.
--
-- Uses: DEDUP_KEY, COUNT_KEY, and one parameter from ARGV[DEDUP_ARGV]: crawls.
-- Defines: DEDUP_KIND, dedup_add(fp), dedup_seen(fp), dedup_remove(fp) (true when a
-- live crawl held it), dedup_count(), dedup_config(), dedup_each_key(visit),
-- dedup_guard(spec, fps), dedup_use(dedup_key, count_key), as every fragment does
-- (include/dedup_exact.lua tells what each does); and three that every fragment
-- defines and this kind alone uses: dedup_source(source), which the other functions
-- then work for (push.lua sets it for each request's job), dedup_crawl_start(source),
-- which job_start.lua calls as a job of the source starts, and dedup_crawl_guard(spec),
-- the keys that dedup_crawl_start writes for the current source (no-ops in the other
-- kinds).
--
-- Damage: a field of D:crawls that is not a number counts as 0, so its source's
-- crawls start again from 1 and meet the sets h:<s>:1.. still there; what they hold
-- is then taken as met in the current crawl and kept N crawls more. Moving D:crawls
-- aside (its repair) does the same. Nothing is fetched twice for it.
--!include keytypes
--!include dedup_keys

local DEDUP_KIND = 'hits' -- claimed in D:kind by the first process that opens the filter

local HITS_KEY, CRAWLS_KEY = hits_key(DEDUP_KEY), hits_crawls_key(DEDUP_KEY)
local NO_SOURCE = '-'
local hits_source = NO_SOURCE
local hits_cache = nil -- crawls (N) and the source's current crawl, read once per source

-- N, and whether it is stored: the stored one wins; created from ARGV with create.
local function hits_limit(create)
    local stored = tonumber(redis.call('HGET', HITS_KEY, 'crawls'))
    if stored then return stored, true end
    local crawls = tonumber(ARGV[DEDUP_ARGV]) or 1
    if create then redis.call('HSET', HITS_KEY, 'crawls', crawls) end
    return crawls, create
end

-- A count of crawls as stored: a whole number from 0, or 0 for text (a damaged field).
local function hits_count(value)
    local n = tonumber(value or '')
    if not n or n ~= n or n < 0 or n == math.huge then return 0 end
    return math.floor(n)
end

-- Read once per filter and source; read again by the first write, so that N is stored
-- even when a check (dedup_guard) read it first.
local function hits_state(create)
    if hits_cache and (hits_cache.stored or not create) then return hits_cache end
    local crawls, stored = hits_limit(create)
    local current = hits_cache and hits_cache.current
        or hits_count(redis.call('HGET', CRAWLS_KEY, hits_source))
    hits_cache = {crawls = crawls, stored = stored, current = current}
    return hits_cache
end

local function hits_base(crawl)
    return hits_base_key(DEDUP_KEY, hits_source, crawl)
end

-- The live crawl whose set holds fp, the newest first; nil when none does.
local function hits_find(state, fp)
    for crawl = state.current, math.max(0, state.current - state.crawls), -1 do
        if redis.call('SISMEMBER', hits_base(crawl), fp) == 1 then return crawl end
    end
    return nil
end

-- Returns true when fp was new (and records it); false when a live crawl met it,
-- and then it is the current crawl's: a hit keeps it.
local function dedup_add(fp)
    local state = hits_state(true)
    local found = hits_find(state, fp)
    if found == state.current then return false end
    if found then
        redis.call('SREM', hits_base(found), fp)
    else
        redis.call('INCR', COUNT_KEY)
    end
    redis.call('SADD', hits_base(state.current), fp)
    return found == nil
end

local function dedup_seen(fp)
    return hits_find(hits_state(false), fp) ~= nil
end

local function dedup_remove(fp)
    local found = hits_find(hits_state(false), fp)
    if not found then return false end
    redis.call('SREM', hits_base(found), fp)
    redis.call('DECR', COUNT_KEY)
    return true
end

local function dedup_count()
    return tonumber(redis.call('GET', COUNT_KEY) or '0')
end

local function dedup_config()
    hits_limit(true)
    return redis.call('HGETALL', HITS_KEY)
end

-- Sum of visit(key) over every key of every source's live crawls, and the hashes.
local function dedup_each_key(visit)
    local crawls, total = hits_limit(false), 0
    local counted = redis.call('HGETALL', CRAWLS_KEY)
    if redis.call('HEXISTS', CRAWLS_KEY, NO_SOURCE) == 0 then  -- requests of no job
        counted[#counted + 1], counted[#counted + 2] = NO_SOURCE, '0'
    end
    for i = 1, #counted, 2 do
        local source, current = counted[i], hits_count(counted[i + 1])
        for crawl = math.max(0, current - crawls), current do
            total = total + visit(hits_base_key(DEDUP_KEY, source, crawl))
        end
    end
    return total + visit(HITS_KEY) + visit(CRAWLS_KEY) + visit(COUNT_KEY)
end

-- The parameters first (numbers: the crawl range follows them; D:crawls is only
-- checked to be a hash, its source's field read leniently: a check of every source's
-- count would cost every source at each call); then the source's live crawls, with
-- the one before them (dedup_crawl_start deletes it) and the next one. Every
-- fingerprint of a source meets the same keys: fps is not needed.
local function dedup_guard(spec, _)
    spec_add(spec, COUNT_KEY, 'counter')
    spec_add(spec, HITS_KEY, 'numbers')
    spec_add(spec, CRAWLS_KEY, 'hash')
    if key_type_problem({HITS_KEY, 'numbers', CRAWLS_KEY, 'hash'}) then return end
    local state = hits_state(false)
    for crawl = math.max(0, state.current - state.crawls - 1), state.current + 1 do
        spec_add(spec, hits_base(crawl), 'set')
    end
end

local function dedup_crawl_guard(spec)
    dedup_guard(spec, {})
end

local function dedup_use(dedup_key, count_key)
    DEDUP_KEY, COUNT_KEY, hits_cache = dedup_key, count_key, nil
    HITS_KEY, CRAWLS_KEY = hits_key(dedup_key), hits_crawls_key(dedup_key)
end

local function dedup_source(source)
    source = (source == nil or source == '') and NO_SOURCE or source
    if source ~= hits_source then hits_source, hits_cache = source, nil end
end

-- A crawl of the source starts: it is the current one, and what the crawl N + 1
-- before it met, and no crawl since, is forgotten.
local function dedup_crawl_start(source)
    dedup_source(source)
    local state = hits_state(true)
    state.current = state.current + 1  -- not HINCRBY: a field of text is rewritten, not refused
    redis.call('HSET', CRAWLS_KEY, hits_source, state.current)
    local dropped = state.current - state.crawls - 1
    if dropped < 0 then return end
    local forgotten = hits_base(dropped)
    redis.call('DECRBY', COUNT_KEY, redis.call('SCARD', forgotten))
    redis.call('DEL', forgotten)
end
