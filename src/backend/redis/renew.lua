-- renew.lua: extend each of N leases if its holder still holds it (N >= 1; N > 1 for batched
-- renewals). Never recreates a missing key and never revives a released one: a lease that
-- expired, was released, was taken over or was lost with the server's data stays lost.
-- (A released lock's tombstone starts with '~', so it is never taken for a held one; a value
-- not of tenure's shape, see acquire.lua, is never extended, whatever it contains.)
--
-- KEYS, for entry i (1-based):
--   KEYS[i]     the lock key <prefix>{<name>}, see acquire.lua for its layout
-- ARGV, for entry i:
--   ARGV[2i-1]  the holder token, 32 lowercase hex digits
--   ARGV[2i]    the new ttl in milliseconds, from now
--
-- Returns an array with one entry per lease:
--   1                 held: the ttl restarted
--   0                 not held
--   {-1, message}     this entry failed (e.g. WRONGTYPE, NOPERM); the others stand.

-- Only values of tenure's (`ours`, value.lua) are renewed.

local out = {}
for i = 1, #KEYS do
  local lock = KEYS[i]
  local cur = redis.pcall('GET', lock)
  if type(cur) == 'table' then
    out[i] = {-1, cur.err or 'error'}
  elseif cur and string.byte(cur, 1) == 43 and string.find(cur, ARGV[2 * i - 1], 2, true) == 2
    and ours(cur) then
    redis.call('PEXPIRE', lock, ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
