-- Deleting a queue: included, never run alone.
--
-- Uses: nothing from the including script.
-- Defines: queue_delete(levels, inflight, seq, signal): deletes the priority
-- levels' sorted set, every level list, the leases, the lease counter and the
-- signal list; returns the number of keys deleted.

local function queue_delete(levels, inflight, seq, signal)
    local deleted = 0
    for _, level in ipairs(redis.call('ZRANGE', levels, 0, -1)) do
        deleted = deleted + redis.call('DEL', levels .. ':' .. level)
    end
    return deleted + redis.call('DEL', levels, inflight, seq, signal)
end
