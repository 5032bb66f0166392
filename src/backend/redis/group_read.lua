-- group_read.lua: read a sharded group's record (see group.rs), bounded: whatever is stored
-- there, however large or of whatever type, the reply stays small.
--
-- KEYS:
--   KEYS[1]  the record <prefix>{<group>}:group-record, a string
-- ARGV:
--   ARGV[1]  the longest record accepted, in bytes
--
-- Returns {0} without a record, {1, text} with one, {2} when the key holds another type,
-- {3, length} when the string is longer than ARGV[1]. Commands: STRLEN and GET only.

local k = KEYS[1]
local n = redis.pcall('STRLEN', k)
if type(n) == 'table' and n.err then
  -- Another type is a damaged record; anything else (a denied command) stays an error.
  if string.find(n.err, 'WRONGTYPE', 1, true) then
    return {2}
  end
  return redis.error_reply(n.err)
end
if n > tonumber(ARGV[1]) then
  return {3, n}
end
local v = redis.call('GET', k)
if not v then
  return {0}
end
return {1, v}
