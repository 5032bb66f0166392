-- completion_record.lua: write a run-once job's completion record (see completion.rs), fenced:
-- only while the writing term is the lock's latest, in the same step as the check.
--
-- KEYS:
--   KEYS[1]  the fencing counter      <prefix>{<name>}:fence
--   KEYS[2]  the completion record    <prefix>{<name>}:done, a string without expiry
-- ARGV:
--   ARGV[1]  the writing term's fencing token, in decimal
--   ARGV[2]  the record's text
--
-- Returns 1 when written, 0 when the counter is not ARGV[1]: a later term was granted, or the
-- counter was lost (a restart without persistence, a FLUSHALL), which proves nothing.
-- Commands: GET, SET.

local c = redis.pcall('GET', KEYS[1])
if type(c) ~= 'string' or c ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
