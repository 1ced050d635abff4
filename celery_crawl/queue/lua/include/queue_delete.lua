-- Deleting a queue: included, never run alone.
--
-- Uses: nothing from the including script. Includes levels (its queue_guard names
-- the keys queue_delete reads and writes, for a script's check before its first write).
-- Defines: queue_delete(levels, inflight, seq, signal, sites): deletes the priority
-- levels' sorted set, every level list, the leases, the lease counter, the
-- signal list, and the entries parked under their sites (include/sites.lua; sites is
-- the group's site prefix); returns the number of keys deleted.

--!include levels

local function queue_delete(levels, inflight, seq, signal, sites)
    local deleted = 0
    for _, level in ipairs(redis.call('ZRANGE', levels, 0, -1)) do
        deleted = deleted + redis.call('DEL', level_key(levels, level))
    end
    deleted = deleted + site_parked_delete(sites, levels)
    return deleted + redis.call('DEL', levels, inflight, seq, signal)
end
