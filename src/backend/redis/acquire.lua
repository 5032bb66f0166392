-- acquire.lua: one attempt to take each of N locks (N >= 1; N > 1 when concurrent acquires
-- are coalesced into one call). Entries are processed in order, so two entries for the same
-- lock in one call behave exactly as two calls would.
--
-- The lock key, when present, holds a value with fixed positions (1-based), so that the
-- scripts compare and patch it in place instead of splitting it into new strings (Redis
-- hashes every byte of every string a script creates; see e2e/scripts/redis-script-costs.py):
--   1       '+' held, or '~' released (a tombstone: free for the next acquire)
--   2..33   the holder token, 32 lowercase hex digits
--   34      '1' when someone watches the lock (a waiter was told "busy", or an observer
--           subscribed): grants and releases are then published; '0' otherwise
--   35..66  the holder token of the release before this grant (a replayed release by it still
--           reports success after a successor took the lock), or 32 '-' when there was none
--   67..    the fencing token in decimal, ':', the holder's identity
-- held: PX the lease ttl. released: the same value with '~' first; its ttl is what remained
-- of the lease, at least the release-ack ttl. A missing key is free as well.
-- A value is tenure's only if it has exactly this shape (68 bytes at least; `ours` in
-- value.lua, which every script starts with, checks every fixed position): anything else under the key is foreign. A foreign value is
-- never taken, overwritten or marked, whatever its first byte: an acquire answers busy with no
-- identity, and renew, release and inspect leave it alone too.
--
-- KEYS, for entry i (1-based):
--   KEYS[3i-2]  the lock key        <prefix>{<name>}
--   KEYS[3i-1]  the fencing counter <prefix>{<name>}:fence   integer, no ttl
--   KEYS[3i]    the hand-over key   <prefix>{<name>}:next    '<fencing>:<identity>': the term
--               that handed over and the preferred next holder ('' for anyone), PX the
--               hand-over window (handoff.lua). It counts only for that term's tombstone (or
--               when the lock key is gone): a later grant makes it stale without a write.
-- ARGV, for entry i:
--   ARGV[3i-2]  the holder token, 32 lowercase hex digits
--   ARGV[3i-1]  the holder's identity (any text without control characters)
--   ARGV[3i]    the ttl in milliseconds
--
-- Returns an array with one entry per lock:
--   fencing                  granted: an integer. A fresh grant INCRs the counter; when the
--                            counter is missing (a restart without persistence, a FLUSHALL)
--                            it is first seeded with the server's TIME in microseconds, so
--                            tokens keep rising. A replay by the current holder gets its
--                            original token back, with the ttl restarted from now.
--   {0, pttl, identity}      busy: the holder's remaining ttl in ms (-1: no expiry) and identity
--                            (false if the key does not hold a tenure lock); or, for a free
--                            lock handed over to another identity, the hand-over window's
--                            remaining ms and the target.
--   {-1, message}            this entry failed (e.g. WRONGTYPE, NOPERM); the others stand.
--
-- Side effect of a fresh grant: PUBLISH "g:<fencing>:<identity>" on the channel named like the
-- lock key when the lock is watched, or "G:<fencing>:<identity>" when the key was missing (so
-- nobody could have marked it; observers mark the new value). Unwatched grants publish nothing.

local out = {}
for i = 1, #KEYS / 3 do
  local lock, fence, next = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local holder, identity, ttl = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local cur = redis.pcall('GET', lock)
  local mine = type(cur) == 'string' and ours(cur)
  if type(cur) == 'table' then
    out[i] = {-1, cur.err or 'error'}
  elseif cur and not (mine and string.byte(cur, 1) == 126) then
    -- Held ('+' = 43), or a foreign value, which is never taken ('~' = 126 marks a tombstone,
    -- which is free). string.find with plain = true compares in place, creating no string.
    if mine and string.find(cur, holder, 2, true) == 2 then
      -- A replay by the current holder: the original token, with the ttl restarted from now.
      redis.call('PEXPIRE', lock, ttl)
      out[i] = tonumber(string.match(cur, '^%d+', 67))
    else
      -- Busy. The caller will wait for the release: mark the lock watched ('1' = 49).
      local who = false
      if mine then
        if string.byte(cur, 34) ~= 49 then
          redis.call('SETRANGE', lock, '33', '1')
        end
        local sep = string.find(cur, ':', 67, true)
        who = sep and string.sub(cur, sep + 1) or false
      end
      out[i] = {0, redis.call('PTTL', lock), who}
    end
  else
    -- Free: never held, expired, or released; handed over to another identity while the
    -- hand-over window runs.
    local to = redis.pcall('GET', next)
    if type(to) == 'string' then
      local sep = string.find(to, ':', 1, true)
      if not sep or (cur and string.sub(to, 1, sep - 1) ~= string.match(cur, '^%d+', 67)) then
        to = false
      else
        to = string.sub(to, sep + 1)
      end
    end
    local f
    if type(to) == 'table' then
      f = to
    elseif to and to ~= '' and to ~= identity then
      if mine and string.byte(cur, 34) ~= 49 then
        -- Whoever waits is woken by the target's grant, or retries when the window ends.
        redis.call('SETRANGE', lock, '33', '1')
      end
      f = {0, redis.call('PTTL', next), to}
    else
      f = redis.pcall('INCR', fence)
    end
    if type(f) == 'table' and f[1] == 0 then
      out[i] = f
    elseif type(f) == 'table' then
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
      local watched, ack = '0', NONE
      if cur then
        -- A tombstone: carry the watch mark over, and remember whose release it was.
        ack = string.sub(cur, 2, 33)
        if string.byte(cur, 34) == 49 then
          watched = '1'
          redis.call('PUBLISH', lock, 'g:' .. fs .. ':' .. identity)
        end
      else
        redis.call('PUBLISH', lock, 'G:' .. fs .. ':' .. identity)
      end
      redis.call('SET', lock, '+' .. holder .. watched .. ack .. fs .. ':' .. identity, 'PX', ttl)
      out[i] = f
    end
  end
end
return out
