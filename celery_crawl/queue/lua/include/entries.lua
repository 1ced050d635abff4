-- Reading queue entries: included, never run alone.
--
-- An entry is a header, then the encoded request. The header's first byte is the
-- job id's length (0 to 63), plus 128 when a fingerprint follows the job id (spider
-- dedup scope, for cancel()), plus 64 when a site follows (per-site limits,
-- include/sites.lua). Then the job id, then 1 byte length and the fingerprint, then
-- 1 byte length and the site. In a lease member the entry starts at offset 13.
--
-- Uses: nothing from the including script.
-- Defines: entry_job, entry_fp, entry_site, entry_problem, entry_hex.

local function entry_job(entry, offset)
    local length = (string.byte(entry, offset) or 0) % 64
    return string.sub(entry, offset + 1, offset + length)
end

-- The fingerprint an entry carries, or nil.
local function entry_fp(entry, offset)
    local flags = string.byte(entry, offset) or 0
    if flags < 128 then return nil end
    local at = offset + 1 + flags % 64
    return string.sub(entry, at + 1, at + (string.byte(entry, at) or 0))
end

-- The site an entry carries, or nil.
local function entry_site(entry, offset)
    local flags = string.byte(entry, offset) or 0
    if flags % 128 < 64 then return nil end
    local at = offset + 1 + flags % 64
    if flags >= 128 then at = at + 1 + (string.byte(entry, at) or 0) end
    local length = string.byte(entry, at) or 0
    if length == 0 then return nil end
    return string.sub(entry, at + 1, at + length)
end

-- What is wrong with an entry's header, or nil when it can be read: its job id,
-- fingerprint and site within the entry, and a request after them.
local function entry_problem(entry)
    local size = #entry
    if size == 0 then return 'an empty entry' end
    local flags = string.byte(entry, 1)
    local at = 2 + flags % 64  -- after the job id
    if at > size + 1 then return 'a job id longer than the entry' end
    if flags >= 128 then
        if at > size then return 'a fingerprint past the end of the entry' end
        at = at + 1 + string.byte(entry, at)
    end
    if flags % 128 >= 64 then
        if at > size then return 'a site past the end of the entry' end
        if string.byte(entry, at) == 0 then return 'an empty site' end
        at = at + 1 + string.byte(entry, at)
    end
    if at > size then return 'no request after the header' end
    return nil
end

-- Up to limit bytes of an entry as hex, for a dead-letter record (JSON holds no bytes).
local function entry_hex(entry, limit)
    return (string.gsub(string.sub(entry, 1, limit), '.', function(c)
        return string.format('%02x', string.byte(c))
    end))
end
