-- fenced_set.lua: write a value only if the writer's fencing token is at least the highest
-- token accepted for it, in one atomic step (tenure::fence::redis::fenced_set runs this
-- script; docs/fencing.md shows it for other languages).
--
-- KEYS[1]  the value's key
-- KEYS[2]  its fence key: the highest token accepted (keep both in one hash slot on a
--          cluster, e.g. `{report}` and `{report}:fence`)
-- ARGV[1]  the writer's fencing token, in decimal (TENURE_FENCING_TOKEN)
-- ARGV[2]  the value
--
-- Returns 1 when written, 0 when refused: a newer term has written, the writer must stop.
-- Tokens compare as Lua numbers (doubles): exact up to 2^53, far above every token tenure
-- issues (microseconds since 1970 plus a counter; a resourceVersion on Kubernetes).

local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = tonumber(ARGV[1])
if token < highest then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
