-- Delete a queue: its priority levels, level lists, leases, counter, signal and
-- parked entries.
--
-- KEYS[1]  queue levels: sorted set of priority levels
-- KEYS[2]  in-flight leases
-- KEYS[3]  lease counter
-- KEYS[4]  signal list
-- KEYS[5]  job key prefix (the group's site prefix is derived from it)
-- ARGV     none
-- Returns  the number of keys deleted
--!include queue_delete

return queue_delete(KEYS[1], KEYS[2], KEYS[3], KEYS[4], site_prefix(KEYS[5]))
