-- Pop up to n requests, highest priority first, and lease them in one step.
--
-- KEYS[1]  queue levels: sorted set of priority levels, score = -priority
-- KEYS[2]  in-flight leases: sorted set, score = lease deadline (ms)
-- KEYS[3]  lease counter
-- KEYS[4]  job key prefix: a job's hash is KEYS[4] .. job id
-- KEYS[5]  dead-letter list, KEYS[6] the spider's stats hash: for poison (include/poison.lua)
-- KEYS[7]  the group's site prefix (include/sites.lua): sites' keys are derived from it
-- ARGV[1]  n, the most requests to lease
-- ARGV[2]  lease duration, ms (the deadline is taken from the server's clock)
-- ARGV[3]  pop side: 'head' or 'tail', which end of a level list to pop
-- ARGV[4]  the most records the dead-letter list keeps
-- ARGV[5]  'sites' to hold entries that carry a site to its limits (include/sites.lua),
--          '' to lease in plain priority order (entries parked while limits were on
--          come after the queue's levels)
-- ARGV[6]  with 'sites': the default limits, "concurrency interval_ms burst" ('' without)
-- ARGV[7]  with 'sites': overrides, '1' when the group's site limits hash
--          (include/sites.lua) names sites of other limits ('' without)
-- Returns  {leased members, wait}: a member is 8-byte lease id .. 4-byte priority ..
--          entry; wait is -1, or when nothing was leased and entries are parked,
--          the ms until the first parked site may take one (a pop waits that long)
--
-- A lease member is unique, so identical payloads never merge in flight. An entry
-- (include/entries.lua) carries its job id, and may carry a fingerprint and a site.
-- An entry of a job that no longer runs (closed at a limit) is discarded instead. An
-- entry that cannot be read, or of an unknown job, is poison: dead-lettered and
-- counted in this call, never leased (include/poison.lua).
--
-- With 'sites', an entry whose site may not take one more request now (at its
-- concurrency cap, its rate's next slot not due, paused) is parked under its site,
-- at its priority, and the queue behind it keeps flowing: a slow site never holds
-- back the others. Parked entries of the sites whose time has come go first, when
-- their priority is not below the queue's top; within a site, priority and order hold.
--
-- Out of memory (maxmemory, noeviction), the call is refused before its first pop
-- (include/room.lua): Redis would let the pops through, and the leases after them.
--
-- The keys it writes are checked first (include/keytypes.lua): while one of them has
-- the wrong type the call is refused before it pops anything, and the caller repairs.
-- A list met later is checked before its pop, and the pop stops there. A job hash of the
-- wrong type makes its entries poison. The keys of the sites of the entries a pop takes
-- (their hash, leases, waiting set and parked levels) are checked before it from a
-- peek (LRANGE) at those entries: the first pop's with the others before any write,
-- a later pop's just before it, and that pop stops there too.

local JOB_PREFIX = KEYS[4]
local QUEUE, DEADLETTER, STATS, DEADLETTER_MAX = KEYS[1], KEYS[5], KEYS[6], tonumber(ARGV[4])
--!include jobs
--!include poison
--!include keytypes
--!include room

local levels, inflight = KEYS[1], KEYS[2]
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local want = tonumber(ARGV[1])
local deadline = now + tonumber(ARGV[2])
local pop = ARGV[3] == 'tail' and 'RPOP' or 'LPOP'
local park_push = ARGV[3] == 'tail' and 'LPUSH' or 'RPUSH'
local SITES = ARGV[5] == 'sites'
local sites, parked_index = KEYS[7], parked_key(levels)
local taken = {}  -- {priority, entry, site whose cap counts it, or false}
-- the common case of an idle spider: nothing queued, nothing parked (a key of the wrong type
-- exists, and is met by the guard below)
if redis.call('EXISTS', levels, parked_index) == 0 then return {{}, -1} end

local checked = {}  -- lists already checked
local guard = {levels, 'zset', inflight, 'zset', KEYS[3], 'counter', DEADLETTER, 'list',
    STATS, 'hash', JOB_STATES_KEY, 'hash', ACTIVE_JOBS_KEY, 'set'}
local function guard_key(key, wanted)
    guard[#guard + 1] = key
    guard[#guard + 1] = wanted
end
if SITES then
    guard_key(parked_index, 'zset')
    guard_key(site_known_key(sites), 'set')
    guard_key(site_limits_key(sites), 'hash')
end
for _, level in ipairs(redis.call('ZRANGE', levels, 0, want - 1)) do
    guard_key(level_key(levels, level), 'list')
    checked[level_key(levels, level)] = true
end
local refused = refuse_damaged(guard)
if refused then return refused end
refuse_when_full(KEYS[3])

-- A list not checked above (the loop went past them): stop before it if damaged;
-- a later call checks it first, and refuses.
local function damaged_list(list)
    if checked[list] then return false end
    checked[list] = true
    return key_type_problem({list, 'list'}) ~= nil
end

local function damaged_level(top)
    return damaged_list(level_key(levels, top))
end

local function keep(entry, priority, counted, job)
    taken[#taken + 1] = {priority, entry, counted}
    job_leased(job)
end

-- An entry of a job that no longer runs: discarded and counted, or poison if the job
-- is unknown.
local function purge(entry, job)
    if not job_exists(job) then return poison(entry, 'an unknown job', 'lease') end
    job_add(job, 'pending', -1)
    job_add(job, 'purged', 1)
end

-- Lease an entry that counts against no site, unless its job no longer runs.
local function take(entry, priority)
    local problem = entry_problem(entry)
    if problem then return poison(entry, problem, 'lease') end
    local job = entry_job(entry, 1)
    if job_running(job) then keep(entry, priority, false, job) else purge(entry, job) end
end

local function lease_taken()
    if #taken == 0 then return {} end
    local first = redis.call('INCRBY', KEYS[3], #taken) - #taken
    local members = {}
    for i, t in ipairs(taken) do
        local id = first + i
        local high = math.floor(id / 2 ^ 32) % 2 ^ 31 + (t[3] and 2 ^ 31 or 0)
        local member = struct.pack('>I4I4i4', high, id % 2 ^ 32, tonumber(t[1])) .. t[2]
        redis.call('ZADD', inflight, deadline, member)
        if t[3] then
            redis.call('ZADD', site_leases_key(sites, t[3]), deadline, string.sub(member, 1, 8) .. levels)
        end
        members[i] = member
    end
    return members
end

local function top_priority()
    local top = redis.call('ZRANGE', levels, 0, 0)[1]
    return top and tonumber(top) or nil
end

-- Lease in plain priority order from an index of levels (a sorted set of priorities,
-- a list per level: the queue's own, or a site's parked ones), until n are taken.
local function take_levels(index)
    while #taken < want do
        local top = redis.call('ZRANGE', index, 0, 0)[1]
        if not top or damaged_list(level_key(index, top)) then break end
        local list = level_key(index, top)
        local payloads = redis.call(pop, list, want - #taken)
        if not payloads or redis.call('EXISTS', list) == 0 then redis.call('ZREM', index, top) end
        for _, entry in ipairs(payloads or {}) do take(entry, top) end
    end
end

-- Limits off: entries parked while they were on are leased too, once the queue's own
-- levels run short (so none is stranded), site by site, each in its priority order.
-- A site whose parked keys are damaged is left for a lease with limits on to repair.
local function take_parked_of(site)
    local q = site_parked_key(levels, site)
    if key_type_problem({q, 'zset', site_waiting_key(sites, site), 'set'}) then return end
    take_levels(q)
    if redis.call('EXISTS', q) == 0 then site_parked_none(sites, levels, site) end
end

local function take_parked()
    if key_type_problem({parked_index, 'zset'}) then return end
    for _, site in ipairs(redis.call('ZRANGE', parked_index, 0, -1)) do
        if #taken >= want then break end
        take_parked_of(site)
    end
end

if not SITES then
    take_levels(levels)
    if #taken < want and redis.call('EXISTS', parked_index) == 1 then take_parked() end
    return {lease_taken(), -1}
end

-- per-site limits -------------------------------------------------------------

local defaults = site_parse_limits(ARGV[6])
local any_parked = redis.call('EXISTS', parked_index) == 1  -- else no site has parked entries
local overrides = ARGV[7] == '1'
local states, limits = {}, {}

local function limits_of(site)
    if not limits[site] then
        local text = overrides and redis.call('HGET', site_limits_key(sites), site)
        limits[site] = text and site_parse_limits(text) or defaults
    end
    return limits[site]
end

local function state_of(site)
    local state = states[site]
    if state then return state end
    local v = redis.call('HMGET', site_key(sites, site), 'tat', 'until', 'delay', 'leased', 'parked',
        'robots')
    if not v[4] then redis.call('SADD', site_known_key(sites), site) end
    local leases = site_leases_key(sites, site)
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', '(' .. now)  -- lost leases stop counting
    state = {inflight = redis.call('ZCARD', leases), tat = tonumber(v[1] or '0'),
        paused = tonumber(v[2] or '0'), delay = tonumber(v[3] or '0'),
        leased = tonumber(v[4] or '0'), parked_total = tonumber(v[5] or '0'),
        robots = tonumber(v[6] or '0') or 0,
        parked = any_parked and redis.call('ZSCORE', parked_index, site) ~= false,
        dirty = not v[4]}
    states[site] = state
    return state
end

-- Lease the site's parked entries while it may take them, and while they are
-- not below the queue's top priority.
local function drain(site)
    local state, lim = state_of(site), limits_of(site)
    local q = site_parked_key(levels, site)
    local main = top_priority()  -- the queue's own levels do not change while draining
    while #taken < want and site_wait_ms(state, lim, now) == 0 do
        local top = redis.call('ZRANGE', q, 0, 0)[1]
        if not top then break end
        if main and tonumber(top) < main then break end
        local list = level_key(q, top)
        if damaged_list(list) then break end  -- refused, and so repaired, once the site is due
        local entry = redis.call(pop, list)
        if redis.call('EXISTS', list) == 0 then redis.call('ZREM', q, top) end
        local job = entry and entry_job(entry, 1)
        if job and job_running(job) then
            keep(entry, top, site_take(state, lim, now) and site, job)
        elseif job then
            purge(entry, job)
        end
    end
    if redis.call('EXISTS', q) == 0 then
        site_parked_none(sites, levels, site)
        state.parked = false
    else
        redis.call('ZADD', parked_index, site_ready_at(sites, site, state, lim, now, deadline), site)
    end
end

local function park(site, state, priority, entry)
    local q = site_parked_key(levels, site)
    if not state.parked then site_parked_first(sites, levels, site) end
    any_parked = true
    redis.call(park_push, level_key(q, priority), entry)
    redis.call('ZADD', q, 'NX', -tonumber(priority), priority)
    state.parked = true
    state.parked_total = state.parked_total + 1
    state.dirty = true
end

-- The keys a site is written to when an entry of it is taken from a level list at
-- priority (state_of, park, site_take, lease_taken), added to spec.
local function site_keys(spec, site, priority)
    local q = site_parked_key(levels, site)
    for _, kt in ipairs({{site_key(sites, site), 'hash'}, {site_leases_key(sites, site), 'zset'},
            {site_waiting_key(sites, site), 'set'}, {q, 'zset'}, {level_key(q, priority), 'list'}}) do
        spec[#spec + 1] = kt[1]
        spec[#spec + 1] = kt[2]
    end
    return spec
end

-- The entries the next pop of list takes (n of them); none when list is damaged.
local function peek(list, n)
    local found = pop == 'RPOP' and redis.pcall('LRANGE', list, -n, -1)
        or redis.pcall('LRANGE', list, 0, n - 1)
    return found.err and {} or found
end

-- A pop must not meet a damaged site key after it took its entries: true when one of
-- the sites of the entries it would take has one (the loop stops before it; a later
-- call, finding that level on top, checks it first and refuses).
local sites_checked = {}
local function damaged_site(list, n, priority)
    for _, entry in ipairs(peek(list, n)) do
        local site = not entry_problem(entry) and entry_site(entry, 1)
        if site and not sites_checked[site .. '|' .. priority] then
            if key_type_problem(site_keys({}, site, priority)) then return true end
            sites_checked[site .. '|' .. priority] = true
        end
    end
    return false
end

local due = any_parked
    and redis.call('ZRANGE', parked_index, '-inf', now, 'BYSCORE', 'LIMIT', 0, want)
-- Nothing written yet: the keys of the sites due are checked too.
guard = {}
for _, site in ipairs(due or {}) do
    local q = site_parked_key(levels, site)
    guard_key(q, 'zset')
    guard_key(site_key(sites, site), 'hash')
    guard_key(site_leases_key(sites, site), 'zset')
    local top = redis.pcall('ZRANGE', q, 0, 0)[1]  -- pcall: q itself may be damaged
    if type(top) == 'string' then
        guard_key(level_key(q, top), 'list')
        checked[level_key(q, top)] = true
    end
end
local first = redis.call('ZRANGE', levels, 0, 0)[1]  -- the first pop's entries' sites
for _, entry in ipairs(first and peek(level_key(levels, first), want) or {}) do
    local site = not entry_problem(entry) and entry_site(entry, 1)
    if site then
        site_keys(guard, site, first)
        sites_checked[site .. '|' .. first] = true  -- by this guard: the pop checks them no more
    end
end
refused = refuse_damaged(guard)
if refused then return refused end
for _, site in ipairs(due or {}) do
    if #taken >= want then break end
    drain(site)
end

local moved, max_moved, parked_now = 0, want * 4 + 64, {}
while #taken < want and moved < max_moved do
    local top = redis.call('ZRANGE', levels, 0, 0)[1]
    if not top or damaged_level(top) then break end
    local list = level_key(levels, top)
    if damaged_site(list, want - #taken, top) then break end
    local payloads = redis.call(pop, list, want - #taken)
    if not payloads or redis.call('EXISTS', list) == 0 then
        redis.call('ZREM', levels, top)
    end
    for _, entry in ipairs(payloads or {}) do
        local problem = entry_problem(entry)
        local site, job = entry_site(entry, 1), entry_job(entry, 1)
        if problem then
            poison(entry, problem, 'lease')
        elseif not job_running(job) then
            purge(entry, job)
        elseif not site then
            keep(entry, top, false, job)
        else
            local state, lim = state_of(site), limits_of(site)
            if state.parked or site_wait_ms(state, lim, now) ~= 0 then
                park(site, state, top, entry)
                parked_now[site] = true
                moved = moved + 1
            else
                keep(entry, top, site_take(state, lim, now) and site, job)
            end
        end
    end
end
for site in pairs(parked_now) do drain(site) end

for site, state in pairs(states) do
    if state.dirty then
        redis.call('HSET', site_key(sites, site), 'tat', state.tat, 'leased', state.leased,
            'parked', state.parked_total)
    end
end

local wait = -1
if #taken == 0 and moved >= max_moved then
    wait = 0  -- more of the queue to look through: at once
elseif #taken == 0 and any_parked then
    local first = redis.call('ZRANGE', parked_index, 0, 0, 'WITHSCORES')
    if first[2] then wait = math.max(0, tonumber(first[2]) - now) end
end
return {lease_taken(), wait}
