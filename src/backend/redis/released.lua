-- released.lua: read who released a lock last, for `tenure status`: the lock key's value when
-- it is a tombstone (a released lock, '~' first; see acquire.lua for the layout and
-- release.lua for how long it lasts). Read-only.
--
-- KEYS:
--   KEYS[1]  the lock key <prefix>{<name>}
--
-- Returns the tombstone, or nil when the lock is held, gone, or the key is not tenure's
-- (`ours`, value.lua). Commands: GET.

local v = redis.pcall('GET', KEYS[1])
if type(v) == 'string' and string.byte(v, 1) == 126 and ours(v) then
  return v
end
return false
