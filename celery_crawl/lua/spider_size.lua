-- A spider's queue length and dedup size, for the exporter: one call per
-- spider, whatever the dupefilter class, and never O(queue) or O(fingerprints).
--
-- KEYS[1]  queue levels: sorted set of priority levels
-- KEYS[2]  dupefilter key D
-- KEYS[3]  dupefilter count
-- ARGV     none
-- Returns  {queued requests, fingerprints}: the exact count, the bloom
--          filter's estimate (both in KEYS[3]), or, for an expiring filter
--          (D:expiring exists), the sum of its live time buckets' counts
--          (the layout of lua/dedup_expiring.lua)

local queued = 0
for _, level in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    queued = queued + redis.call('LLEN', KEYS[1] .. ':' .. level)
end

local function expiring_count(window, width)
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local total = 0
    for t = math.floor((now - window) / width), math.floor(now / width) do
        local count = KEYS[2] .. ':t:' .. string.format('%d', t) .. ':count'
        total = total + tonumber(redis.call('GET', count) or '0')
    end
    return total
end

local expiring = redis.call('HMGET', KEYS[2] .. ':expiring', 'window_ms', 'width_ms')
if expiring[1] and expiring[2] then
    return {queued, expiring_count(tonumber(expiring[1]), tonumber(expiring[2]))}
end
return {queued, tonumber(redis.call('GET', KEYS[3]) or '0')}
