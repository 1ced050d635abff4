-- Counting a queue's requests: included, never run alone.
--
-- Uses: nothing from the including script.
-- Defines: queue_length(levels): the requests queued over all priority levels
-- of the sorted set levels (leases not included); one LLEN per level in use.

local function queue_length(levels)
    local total = 0
    for _, level in ipairs(redis.call('ZRANGE', levels, 0, -1)) do
        total = total + redis.call('LLEN', levels .. ':' .. level)
    end
    return total
end
