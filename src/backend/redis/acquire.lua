-- acquire.lua: one attempt to take each of N locks (N >= 1; N > 1 when concurrent acquires
-- are coalesced into one call). Entries are processed in order, so two entries for the same
-- lock in one call behave exactly as two calls would.
--
-- The lock key holds one of:
--   held      "<holder>:<fencing>:<acks>:<identity>"  PX the lease ttl
--   released  "~<fencing>:<acks>"                      PX the release-ack ttl (a tombstone)
-- where <holder> is 32 hex digits, <fencing> decimal, and <acks> the holder tokens of the
-- latest releases (0 to 4 of them, 32 hex digits each, newest first) so that a replayed
-- release still reports success. A missing key is free as well.
--
-- KEYS, for entry i (1-based):
--   KEYS[2i-1]  the lock key        <prefix>{<name>}
--   KEYS[2i]    the fencing counter <prefix>{<name>}:fence   integer, no ttl
-- ARGV, for entry i:
--   ARGV[3i-2]  the holder token, 32 lowercase hex digits
--   ARGV[3i-1]  the holder's identity (any text without control characters)
--   ARGV[3i]    the ttl in milliseconds
--
-- Returns an array with one entry per lock:
--   {1, fencing}             granted. `fencing` is an integer for a fresh grant (INCR of the
--                            counter; when the counter is missing, e.g. after a restart without
--                            persistence or a FLUSHALL, it is first seeded with the server's
--                            TIME in microseconds, so tokens keep rising), or the decimal string
--                            of the original token for a replay by the current holder, whose
--                            ttl restarts from now.
--   {0, pttl, identity}      busy: the holder's remaining ttl in ms (-1: no expiry) and identity
--                            (false if the key does not hold a tenure lock).
--   {-1, message}            this entry failed (e.g. WRONGTYPE, NOPERM); the others stand.
--
-- Side effect of a fresh grant: PUBLISH "g:<fencing>:<identity>" on the channel named like the
-- lock key, so observers learn the new holder.

local out = {}
for i = 1, #KEYS / 2 do
  local lock, fence = KEYS[2 * i - 1], KEYS[2 * i]
  local holder, identity, ttl = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local cur = redis.pcall('GET', lock)
  if type(cur) == 'table' then
    out[i] = {-1, cur.err or 'error'}
  elseif cur and string.byte(cur, 1) ~= 126 then
    -- Held ('~' = 126 marks a released lock).
    local fsep = string.find(cur, ':', 34, true)
    if string.sub(cur, 1, 32) == holder and fsep then
      -- A replay by the current holder: the original token, with the ttl restarted from now.
      redis.call('PEXPIRE', lock, ttl)
      out[i] = {1, string.sub(cur, 34, fsep - 1)}
    else
      local who = false
      local asep = fsep and string.find(cur, ':', fsep + 1, true)
      if asep then
        who = string.sub(cur, asep + 1)
      end
      out[i] = {0, redis.call('PTTL', lock), who}
    end
  else
    -- Free: never held, expired, or released (keep the release acks).
    local acks = ''
    if cur then
      local sep = string.find(cur, ':', 2, true)
      if sep then
        acks = string.sub(cur, sep + 1)
      end
    end
    local f = redis.pcall('INCR', fence)
    if type(f) == 'table' then
      out[i] = {-1, f.err or 'error'}
    else
      if f == 1 then
        -- The counter was missing: seed it from the server clock so the token exceeds every
        -- token issued before the counter was lost.
        local t = redis.call('TIME')
        f = tonumber(t[1]) * 1000000 + tonumber(t[2])
        redis.call('SET', fence, string.format('%d', f))
      end
      local fs = string.format('%d', f)
      -- Publish first: a user without the PUBLISH permission fails here, before the lock key
      -- is written (scripts do not roll back).
      redis.call('PUBLISH', lock, 'g:' .. fs .. ':' .. identity)
      redis.call('SET', lock, holder .. ':' .. fs .. ':' .. acks .. ':' .. identity, 'PX', ttl)
      out[i] = {1, f}
    end
  end
end
return out
