-- The open schedulers of a queue: included, never run alone.
--
-- KEY  a sorted set of scheduler ids, score = registration deadline (ms, the
--      server's clock); a registration past its deadline (a killed process) counts
--      as closed, and is dropped by whoever looks.
-- Uses: nothing from the including script.
-- Defines: schedulers_now(): the server's clock in ms; schedulers_prune(key, now):
-- drop lapsed registrations, return how many are open; schedulers_register(key, id,
-- ttl, now): register or renew id for ttl ms, the key expiring with the newest deadline;
-- schedulers_is_open(key, id, now): whether id's registration is live.

local function schedulers_now()
    local now = redis.call('TIME')
    return now[1] * 1000 + math.floor(now[2] / 1000)
end

local function schedulers_prune(key, now)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. now)
    return redis.call('ZCARD', key)
end

local function schedulers_register(key, id, ttl, now)
    redis.call('ZADD', key, now + ttl, id)
    redis.call('PEXPIRE', key, ttl)
end

local function schedulers_is_open(key, id, now)
    local deadline = redis.call('ZSCORE', key, id)
    return deadline ~= false and tonumber(deadline) >= now
end
