-- release.lua: give up each of N locks if its holder holds it (N >= 1; N > 1 when concurrent
-- releases are coalesced into one call). Idempotent: a replayed release by a holder that
-- already released reports success again, and never touches a successor's lock.
--
-- A released lock keeps its value with the first byte turned into '~' (a tombstone, see
-- acquire.lua for the layout; a value not of that shape is foreign: 0, and left alone): free for the next acquire, and still naming the holder that
-- released it, so a replay is recognised; a successor's grant carries that holder token over
-- as its "previous release", so a replay arriving after a successor took the lock is
-- recognised too. The tombstone keeps what remained of the lease's ttl; when the caller says
-- that may be less than the release-ack ttl, it is raised to that.
--
-- KEYS, for entry i (1-based):
--   KEYS[i]     the lock key <prefix>{<name>}
-- ARGV:
--   ARGV[1]     how long a release is remembered at least, in milliseconds
--   ARGV[2]     one character per entry: '1' when the lease may have less than ARGV[1] left
--   ARGV[2+i]   the holder token of entry i, 32 lowercase hex digits; when followed by more
--               text, that text is the identity the lock must name as its holder too
--               (`release_as`: the token came from a restart record, not from this process),
--               and a replay or a tombstone then answers 0
--
-- Returns an array with one entry per lock:
--   1                 released now, or by an earlier call with the same holder token (a replay)
--   0                 not held by this holder token
--   {-1, message}     this entry failed (e.g. WRONGTYPE, NOPERM); the others stand.
--
-- Side effect of a release of a watched lock (see acquire.lua): PUBLISH "r:<fencing>" on the
-- channel named like the lock key, so waiters retry at once. Every waiter and observer marks
-- the lock watched before it listens, so a release of an unwatched lock has no listener and
-- publishes nothing.

-- A foreign value (not `ours`, value.lua) is never released or acknowledged.

local ack_ttl = tonumber(ARGV[1])
local short = ARGV[2]
local out = {}
for i = 1, #KEYS do
  local lock, holder, identity = KEYS[i], ARGV[2 + i], nil
  if #holder > 32 then
    holder, identity = string.sub(holder, 1, 32), string.sub(holder, 33)
  end
  local cur = redis.pcall('GET', lock)
  if type(cur) == 'table' then
    out[i] = {-1, cur.err or 'error'}
  elseif not cur or not ours(cur) then
    out[i] = 0
  elseif identity and (string.byte(cur, 1) ~= 43 or string.find(cur, holder, 2, true) ~= 2
      or string.sub(cur, string.find(cur, ':', 67, true) + 1) ~= identity) then
    -- Not held, not by this token, or not under this identity (the identity follows the
    -- first ':' after the fencing digits; `ours` checked that ':' is there).
    out[i] = 0
  elseif string.find(cur, holder, 2, true) == 2 then
    local state = string.byte(cur, 1)
    if state == 43 then
      if string.byte(cur, 34) == 49 then
        -- Publish first, so that a denied PUBLISH fails before anything is written.
        redis.call('PUBLISH', lock, 'r:' .. string.match(cur, '^%d+', 67))
      end
      -- (Offsets go as strings: a Lua number would be formatted with sprintf on every call.)
      redis.call('SETRANGE', lock, '0', '~')
      if string.byte(short, i) == 49 and redis.call('PTTL', lock) < ack_ttl then
        redis.call('PEXPIRE', lock, ack_ttl)
      end
    end
    -- Held by this holder (now released), or its own tombstone (a replay).
    out[i] = 1
  elseif string.find(cur, holder, 35, true) == 35 then
    -- Released by this holder before the current grant or tombstone: a replay.
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
