-- inspect.lua: read who holds a lock, atomically with its remaining ttl and its counter.
-- Read-only, unless asked to mark the lock watched (what an observer does when it subscribes,
-- so that the next grant is published; see acquire.lua for the layout and the mark).
--
-- KEYS:
--   KEYS[1]  the lock key        <prefix>{<name>}
--   KEYS[2]  the fencing counter <prefix>{<name>}:fence
-- ARGV:
--   ARGV[1]  '1' to mark the lock watched, '0' to only read
--
-- Returns {value, pttl, counter}:
--   value    the lock key's value unless the lock is free (no key, or a tombstone "~..."); a
--            value that is not tenure's (see acquire.lua) is returned as it is
--   pttl     the remaining ttl in milliseconds (-1: no expiry, -2: free)
--   counter  the fencing counter as a decimal string, or nil when it is missing

-- tenure's value, checked as acquire.lua does: a foreign one is returned as it is, never marked.
local function ours(v)
  local _, e = string.find(v, '^[+~][0-9a-f]+')
  local mark = string.byte(v, 34)
  if not e or (mark ~= 48 and mark ~= 49) then
    return false
  end
  if e == 34 then
    local _, none = string.find(v, '^%-+', 35)
    if none ~= 66 then
      return false
    end
  elseif e < 67 then
    return false
  end
  local _, sep = string.find(v, '^%d+:', 67)
  return sep ~= nil and sep <= 86 and (e == 34 or sep == e + 1)
end

local cur = redis.call('GET', KEYS[1])
local state = cur and ours(cur) and string.byte(cur, 1)
if ARGV[1] == '1' and state and string.byte(cur, 34) ~= 49 then
  redis.call('SETRANGE', KEYS[1], '33', '1')
end
local pttl = -2
if state == 126 then
  cur = false
end
if cur then
  pttl = redis.call('PTTL', KEYS[1])
end
return {cur, pttl, redis.call('GET', KEYS[2])}
