-- Counting a queue's requests: included, never run alone.
--
-- Uses: nothing from the including script. Includes sites.
-- Defines: queue_length(levels): the requests queued over all priority levels
-- of the sorted set levels, and those parked under their site (include/sites.lua);
-- leases not included. One LLEN per level in use.

--!include sites

local function queue_length(levels)
    local total = 0
    for _, level in ipairs(redis.call('ZRANGE', levels, 0, -1)) do
        total = total + redis.call('LLEN', levels .. ':' .. level)
    end
    return total + site_parked_length(levels)
end
