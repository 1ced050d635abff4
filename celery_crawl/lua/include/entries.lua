-- Reading queue entries: included, never run alone.
--
-- An entry is a header, then the encoded request. The header's first byte is the
-- job id's length (0 to 63), plus 128 when a fingerprint follows the job id (spider
-- dedup scope, for cancel()), plus 64 when a site follows (per-site limits,
-- include/sites.lua). Then the job id, then 1 byte length and the fingerprint, then
-- 1 byte length and the site. In a lease member the entry starts at offset 13.
--
-- Uses: nothing from the including script.
-- Defines: entry_job, entry_fp, entry_site.

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
