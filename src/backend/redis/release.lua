-- release.lua: give up each of N locks if its holder holds it (N >= 1; N > 1 when concurrent
-- releases are coalesced into one call). Idempotent: a replayed release by a holder that
-- already released reports success again, and never touches a successor's lock.
--
-- A released lock key becomes a tombstone "~<fencing>:<acks>" with PX the release-ack ttl:
-- free for the next acquire, and remembering the holder tokens of the latest releases (this
-- one first, at most 4, 32 hex digits each). A successor's grant carries the acks over into
-- its value, so a replay arriving after a successor took the lock is still recognised. See
-- acquire.lua for the layout of a held lock.
--
-- KEYS, for entry i (1-based):
--   KEYS[i]     the lock key <prefix>{<name>}
-- ARGV:
--   ARGV[1]     how long a release is remembered, in milliseconds (the tombstone's ttl)
--   ARGV[1+i]   the holder token of entry i, 32 lowercase hex digits
--
-- Returns an array with one entry per lock:
--   1                 released now, or by an earlier call with the same holder token (a replay)
--   0                 not held by this holder token
--   {-1, message}     this entry failed (e.g. WRONGTYPE, NOPERM); the others stand.
--
-- Side effect of a release: PUBLISH "r:<fencing>" on the channel named like the lock key, so
-- waiters retry at once.

local ack_ttl = ARGV[1]
local out = {}
for i = 1, #KEYS do
  local lock, holder = KEYS[i], ARGV[1 + i]
  local cur = redis.pcall('GET', lock)
  if type(cur) == 'table' then
    out[i] = {-1, cur.err or 'error'}
  elseif not cur then
    out[i] = 0
  else
    local acks = ''
    local fencing = nil
    if string.byte(cur, 1) == 126 then
      local sep = string.find(cur, ':', 2, true)
      if sep then
        acks = string.sub(cur, sep + 1)
      end
    else
      local fsep = string.find(cur, ':', 34, true)
      local asep = fsep and string.find(cur, ':', fsep + 1, true)
      if asep then
        fencing = string.sub(cur, 34, fsep - 1)
        acks = string.sub(cur, fsep + 1, asep - 1)
      end
    end
    if fencing and string.sub(cur, 1, 32) == holder then
      -- Publish first, so that a denied PUBLISH fails before anything is written.
      redis.call('PUBLISH', lock, 'r:' .. fencing)
      redis.call('SET', lock, '~' .. fencing .. ':' .. holder .. string.sub(acks, 1, 96),
        'PX', ack_ttl)
      out[i] = 1
    else
      -- Tokens sit at 32-character boundaries; a match elsewhere would straddle two tokens.
      local found = 0
      local at = string.find(acks, holder, 1, true)
      while at do
        if (at - 1) % 32 == 0 then
          found = 1
          break
        end
        at = string.find(acks, holder, at + 1, true)
      end
      out[i] = found
    end
  end
end
return out
