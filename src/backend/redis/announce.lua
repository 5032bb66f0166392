-- announce.lua: announce one member of a group, or renew its announcement (sharded leadership;
-- see members.rs for the record's encoding).
--
-- KEYS:
--   KEYS[1]  the group's sorted set <prefix>{<group>}:members: identity -> the server time (ms)
--            at which the announcement runs out; also the name of the group's channel
--   KEYS[2]  the group's records    <prefix>{<group>}:member-records: identity -> record
-- ARGV:
--   ARGV[1]  the member's identity
--   ARGV[2]  its encoded record
--   ARGV[3]  the ttl in milliseconds (a whole number, at least 1)
--
-- Returns 1 when the announcement changed what readers see (a new member, one whose
-- announcement had run out, or a new record), 0 for a plain renewal.
--
-- Side effects: the member's score becomes server now + ttl; a change is PUBLISHed as "a" on
-- the channel named like KEYS[1] (a renewal publishes nothing: readers follow the earliest
-- score by themselves). Both keys live at least as long as the ttl, so a group nobody
-- announces in any more disappears.

local z, h = KEYS[1], KEYS[2]
local id, rec = ARGV[1], ARGV[2]
local ttl = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', z, id)
local changed = not score or tonumber(score) <= now
  or redis.call('HMGET', h, id)[1] ~= rec
if changed then
  -- Publish first, so that a denied PUBLISH fails before anything is written.
  redis.call('PUBLISH', z, 'a')
  redis.call('HSET', h, id, rec)
end
redis.call('ZADD', z, string.format('%d', now + ttl), id)
local keep = redis.call('PTTL', z)
if keep < ttl then
  keep = ttl
end
keep = string.format('%d', keep)
redis.call('PEXPIRE', z, keep)
redis.call('PEXPIRE', h, keep)
if changed then
  return 1
end
return 0
