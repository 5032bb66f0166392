-- handoff.lua: record who should hold a lock next, for a window: before a release to a
-- target (release_to: the holder's own token must hold the lock), or as a request to the
-- holder (request_handoff: any holder). The lock is left as it is; the release that follows
-- is release.lua's. While the key lives and the lock is free, acquire.lua grants only the
-- target; the target's grant (a new term) makes it stale; otherwise it expires with its
-- window, and the release was an ordinary one. The value is '<fencing>:<target>', the
-- fencing token of the term asked to hand over first (see acquire.lua).
--
-- KEYS:
--   KEYS[1]  the lock key      <prefix>{<name>}
--   KEYS[2]  the hand-over key <prefix>{<name>}:next
-- ARGV:
--   ARGV[1]  the holder token that must hold the lock (32 hex digits), or '' for any holder
--   ARGV[2]  the target's identity, '' for anyone
--   ARGV[3]  the window in milliseconds
--
-- Returns 1 when recorded (the lock is held, by ARGV[1] when given), 0 otherwise.

local cur = redis.call('GET', KEYS[1])
if not cur or not ours(cur) or string.byte(cur, 1) ~= 43 then
  return 0
end
if ARGV[1] ~= '' and string.find(cur, ARGV[1], 2, true) ~= 2 then
  return 0
end
redis.call('SET', KEYS[2], string.match(cur, '^%d+', 67) .. ':' .. ARGV[2], 'PX', ARGV[3])
return 1
