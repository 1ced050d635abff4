-- Push the deadline of leases still held further out.
--
-- KEYS[1]  in-flight leases: sorted set, score = lease deadline (ms)
-- KEYS[2]  queue levels: sorted set of priority levels (its sites' leases name it)
-- KEYS[3]  the group's site prefix (include/sites.lua): sites' keys are derived from it
-- ARGV[1]  lease duration from now, ms (server clock)
-- ARGV[2..] the lease members to renew; members no longer leased are skipped
-- Returns  the number of leases renewed
--          (an error naming the key, nothing written, when a key it writes is damaged:
--          include/keytypes.lua)
--
-- A lease that counts against its site's cap is renewed in the site's leases too.

--!include sites
--!include keytypes

local spec = {KEYS[1], 'zset'}  -- every key it writes checked first (include/keytypes.lua)
for i = 2, #ARGV do
    local site = site_counted(ARGV[i])
    if site then spec_add(spec, site_leases_key(KEYS[3], site), 'zset') end
end
local refused = refuse_damaged(spec)
if refused then return refused end

local now = redis.call('TIME')
local deadline = now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[1])
local levels, sites = KEYS[2], KEYS[3]
local renewed = 0
for i = 2, #ARGV do
    if redis.call('ZADD', KEYS[1], 'XX', 'CH', deadline, ARGV[i]) == 1 then
        renewed = renewed + 1
        site_renew(sites, levels, ARGV[i], deadline)
    end
end
return renewed
