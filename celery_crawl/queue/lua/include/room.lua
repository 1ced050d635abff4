-- Out of memory: refuse the call before its first write. Included, never run alone.
--
-- Redis, at its maxmemory with the policy noeviction, refuses a script at its first
-- write, and only if that command may grow memory (deny-oom). A pop (LPOP, ZREM,
-- ZREMRANGEBYSCORE) may not, so a script whose first write is a pop is let through,
-- and every write after it too: leases were taken and expired leases requeued while
-- every renewal and ack was refused, and the same requests were fetched again and
-- again. A script that pops first calls refuse_when_full() before that pop.
--
-- Uses: nothing from the including script.
-- Defines: refuse_when_full(counter): SETRANGE counter 0 '' is deny-oom, so out of
-- memory Redis answers it with its OOM error, which ends the script (the caller sees
-- redis.exceptions.OutOfMemoryError); otherwise it changes nothing (an empty range:
-- no write, no replication, no key made). counter is a key that holds a string
-- or does not exist, of the slot of the script's keys.

local function refuse_when_full(counter)
    redis.call('SETRANGE', counter, 0, '')
end
