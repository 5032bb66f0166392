-- withdraw.lua: remove one member from a group at once (a graceful leave).
--
-- KEYS:
--   KEYS[1]  the group's sorted set <prefix>{<group>}:members (see announce.lua); also the
--            name of the group's channel
--   KEYS[2]  the group's records    <prefix>{<group>}:member-records
-- ARGV:
--   ARGV[1]  the member's identity
--
-- Returns 1 when the member was there (its removal is PUBLISHed as "w" on the group's
-- channel), 0 when it was not (nothing changes: withdrawing twice succeeds).

local z, h, id = KEYS[1], KEYS[2], ARGV[1]
if redis.call('ZSCORE', z, id) then
  -- Publish first, so that a denied PUBLISH fails before anything is written.
  redis.call('PUBLISH', z, 'w')
  redis.call('ZREM', z, id)
  redis.call('HDEL', h, id)
  return 1
end
return 0
