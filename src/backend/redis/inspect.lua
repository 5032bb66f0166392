-- inspect.lua: read who holds a lock, atomically with its remaining ttl and its counter.
-- Read-only, unless asked to mark the lock watched (what an observer does when it subscribes,
-- so that the next grant is published; see acquire.lua for the layout and the mark).
--
-- KEYS:
--   KEYS[1]  the lock key        <prefix>{<name>}
--   KEYS[2]  the fencing counter <prefix>{<name>}:fence
--   KEYS[3]  the hand-over key   <prefix>{<name>}:next (handoff.lua)
-- ARGV:
--   ARGV[1]  '1' to mark the lock watched, '0' to only read
--
-- Returns {value, pttl, counter, next}:
--   value    the lock key's value unless the lock is free (no key, or a tombstone "~..."); a
--            value that is not tenure's (see acquire.lua) is returned as it is
--   pttl     the remaining ttl in milliseconds (-1: no expiry, -2: free)
--   counter  the fencing counter as a decimal string, or nil when it is missing
--   next     the hand-over key's value ('<fencing>:<target>', see acquire.lua), or nil

-- A foreign value (not `ours`, value.lua) is returned as it is, never marked.

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
return {cur, pttl, redis.call('GET', KEYS[2]), redis.call('GET', KEYS[3])}
