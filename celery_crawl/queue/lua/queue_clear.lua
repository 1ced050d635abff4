-- Delete a queue: its priority levels, level lists, leases, counter, signal and
-- parked entries.
--
-- KEYS[1]  queue levels: sorted set of priority levels
-- KEYS[2]  in-flight leases
-- KEYS[3]  lease counter
-- KEYS[4]  signal list
-- KEYS[5]  the group's site prefix (include/sites.lua): sites' keys are derived from it
-- ARGV     none
-- Returns  the number of keys deleted; an error naming the key, nothing deleted, when
--          a key it reads or writes is of another type (include/keytypes.lua)
--!include queue_delete

local spec = {}
queue_guard(spec, KEYS[1], KEYS[5])
local refused = refuse_damaged(spec)
if refused then return refused end
return queue_delete(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
