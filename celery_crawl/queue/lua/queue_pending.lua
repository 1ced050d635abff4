-- Whether a queue still has work anywhere: its queued requests and its leases,
-- counted in one step, so that no request is between the two counts.
--
-- KEYS[1]  queue levels: sorted set of priority levels
-- KEYS[2]  in-flight leases: sorted set, score = lease deadline (ms)
-- ARGV     none
-- Returns  {queued requests, leased requests (any process's, expired or not)}
--!include levels

return {queue_length(KEYS[1]), redis.call('ZCARD', KEYS[2])}
