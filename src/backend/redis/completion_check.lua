-- completion_check.lua: a run-once job's completion check (see completion.rs): the server's
-- clock, whether the checking term is the lock's latest, and the completion record, bounded:
-- whatever is stored there, however large or of whatever type, the reply stays small.
--
-- KEYS:
--   KEYS[1]  the fencing counter      <prefix>{<name>}:fence
--   KEYS[2]  the completion record    <prefix>{<name>}:done, a string without expiry
-- ARGV:
--   ARGV[1]  the checking term's fencing token, in decimal
--   ARGV[2]  the longest record accepted, in bytes
--
-- Returns {seconds, microseconds, latest, state[, text or length]}:
--   seconds, microseconds  the server's TIME
--   latest   1 when the counter is ARGV[1] (no later term was granted), 0 otherwise
--   state    0 no record; 1 a record, its text follows; 2 the key holds another type;
--            3 the string is longer than ARGV[2], its length follows
-- Commands: TIME, GET, STRLEN. Read-only.

local t = redis.call('TIME')
local c = redis.pcall('GET', KEYS[1])
local latest = 0
if type(c) == 'string' and c == ARGV[1] then
  latest = 1
end
local n = redis.pcall('STRLEN', KEYS[2])
if type(n) == 'table' and n.err then
  if string.find(n.err, 'WRONGTYPE', 1, true) then
    return {tonumber(t[1]), tonumber(t[2]), latest, 2}
  end
  return redis.error_reply(n.err)
end
if n > tonumber(ARGV[2]) then
  return {tonumber(t[1]), tonumber(t[2]), latest, 3, n}
end
local v = redis.call('GET', KEYS[2])
if not v then
  return {tonumber(t[1]), tonumber(t[2]), latest, 0}
end
return {tonumber(t[1]), tonumber(t[2]), latest, 1, v}
