-- group_swap.lua: compare-and-swap a sharded group's record (see group.rs).
--
-- KEYS:
--   KEYS[1]  the record <prefix>{<group>}:group-record, a string without expiry
-- ARGV:
--   ARGV[1]  '0': write only if there is no record; '1': only if the record is ARGV[2]
--   ARGV[2]  the text read before (with '1')
--   ARGV[3]  the new text
--
-- Returns 1 when written, 0 when the record was not as expected (a key of another type
-- never is). Commands: GET and SET only.

local k = KEYS[1]
if ARGV[1] == '0' then
  if redis.call('SET', k, ARGV[3], 'NX') then
    return 1
  end
  return 0
end
local v = redis.pcall('GET', k)
if type(v) == 'table' and v.err then
  if string.find(v.err, 'WRONGTYPE', 1, true) then
    return 0
  end
  return redis.error_reply(v.err)
end
if v ~= ARGV[2] then
  return 0
end
redis.call('SET', k, ARGV[3])
return 1
