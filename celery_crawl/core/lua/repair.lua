-- Move aside the keys of a spider that hold the wrong type, and end the jobs
-- whose counters are not numbers (celery_crawl/core/repair.py says when it runs).
--
-- KEYS[1]  the spider's stats hash (the count goes there, field
--          celery_crawl/damaged/keys)
-- KEYS[2]  job key prefix: a job's hash is KEYS[2] .. job id
-- KEYS[3..] the keys to check, one per ARGV entry after ARGV[1]
-- ARGV[1]  number of keys to check n
-- ARGV[2 .. n+1]  the type each of KEYS[3 ..] must have: string, list, set,
--          zset or hash; 'counter' for a string that must be an integer; 'numbers'
--          for a hash whose values must be positive numbers (include/keytypes.lua);
--          'job' for a job's hash (a hash whose counters must be integers)
-- Returns  {keys moved aside, jobs ended}: a key of the wrong type (or a counter
--          that is not an integer) is renamed to
--          key .. '~damaged' (kept for a look; nothing reads it), so the
--          scripts that failed on it start it afresh. A job's hash whose
--          counter is not an integer gets 0 there (the old value kept in
--          field <counter>~damaged) and the job, unless it had ended, ends closed, with reason
--          'damaged: <counter>': its queued requests are discarded when leased.

local JOB_PREFIX = KEYS[2]
--!include jobs
--!include keytypes

local n = tonumber(ARGV[1])
local moved, ended = {}, {}

local function integer(value)
    return string.match(value, '^%-?%d+$') ~= nil
end

local function check_counters(key)
    local values = redis.call('HMGET', key, unpack(JOB_COUNTERS))
    local bad = nil
    for i, counter in ipairs(JOB_COUNTERS) do
        local value = values[i]
        if value and not integer(value) then
            redis.call('HSET', key, counter .. '~damaged', value, counter, 0)
            bad = bad or counter
        end
    end
    if bad and not FINAL[redis.call('HGET', key, 'state')] then
        local job = string.sub(key, #JOB_PREFIX + 1)
        redis.call('HSET', key, 'state', 'running')  -- whatever it was, it was not final
        job_end(job, 'damaged: ' .. bad)
        ended[#ended + 1] = job
    end
end

for i = 1, n do
    local key, want = KEYS[2 + i], ARGV[1 + i]
    local have = redis.call('TYPE', key)['ok']
    local expected = ({job = 'hash', counter = 'string', numbers = 'hash'})[want] or want
    local bad = have ~= 'none' and have ~= expected
    if want == 'counter' and have == 'string' then bad = not integer(redis.call('GET', key)) end
    if want == 'numbers' and have == 'hash' then bad = key_numbers_problem(key) end
    if bad then
        redis.call('RENAME', key, key .. '~damaged')
        moved[#moved + 1] = key
    elseif want == 'job' and have == 'hash' then
        check_counters(key)
    end
end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' and redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('RENAME', KEYS[1], KEYS[1] .. '~damaged')
    moved[#moved + 1] = KEYS[1]
end
if #moved > 0 then count(KEYS[1], 'celery_crawl/damaged/keys', #moved) end
if #ended > 0 then count(KEYS[1], 'celery_crawl/damaged/jobs', #ended) end
return {moved, ended}
