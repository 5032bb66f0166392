-- inspect.lua: read who holds a lock, atomically with its remaining ttl and its counter.
-- Read-only.
--
-- KEYS:
--   KEYS[1]  the lock key        <prefix>{<name>}, see acquire.lua for its layout
--   KEYS[2]  the fencing counter <prefix>{<name>}:fence
-- ARGV: none.
--
-- Returns {value, pttl, counter}:
--   value    the lock key's value when it is held ("<holder>:<fencing>:<acks>:<identity>"),
--            nil when the lock is free (no key, or a release tombstone "~...")
--   pttl     the remaining ttl in milliseconds (-1: no expiry, -2: free)
--   counter  the fencing counter as a decimal string, or nil when it is missing

local cur = redis.call('GET', KEYS[1])
local pttl = -2
if cur and string.byte(cur, 1) == 126 then
  cur = false
end
if cur then
  pttl = redis.call('PTTL', KEYS[1])
end
return {cur, pttl, redis.call('GET', KEYS[2])}
