-- Count queued requests over all priority levels (leases not included).
--
-- KEYS[1]  queue levels: sorted set of priority levels
-- ARGV     none
-- Returns  the number of queued requests
--!include levels

return queue_length(KEYS[1])
