-- Counting a queue's requests: included, never run alone.
--
-- Uses: nothing from the including script. Includes sites and keytypes.
-- Defines: queue_length(levels): the requests queued over all priority levels
-- of the sorted set levels, and those parked under their site (include/sites.lua);
-- leases not included. One LLEN per level in use.
-- queue_guard(spec, levels, sites): adds to a guard spec (include/keytypes.lua) every
-- key of the queue that queue_length reads and a purge or a delete writes: the
-- index, its level lists, the parked index, each parked site's index and lists and
-- its waiting set (sites: the group's site prefix; nil for a script that reads only).
-- One TYPE a key.

--!include sites
--!include keytypes

local function queue_length(levels)
    local total = 0
    for _, level in ipairs(redis.call('ZRANGE', levels, 0, -1)) do
        total = total + redis.call('LLEN', level_key(levels, level))
    end
    return total + site_parked_length(levels)
end

local function queue_members(key)  -- none when key is of another type: the guard names it
    local found = redis.pcall('ZRANGE', key, 0, -1)
    return found.err and {} or found
end

local function queue_guard(spec, levels, sites)
    spec_add(spec, levels, 'zset')
    for _, level in ipairs(queue_members(levels)) do spec_add(spec, level_key(levels, level), 'list') end
    spec_add(spec, parked_key(levels), 'zset')
    for _, site in ipairs(queue_members(parked_key(levels))) do
        local q = site_parked_key(levels, site)
        if sites then spec_add(spec, site_waiting_key(sites, site), 'set') end
        spec_add(spec, q, 'zset')
        for _, level in ipairs(queue_members(q)) do spec_add(spec, level_key(q, level), 'list') end
    end
end
