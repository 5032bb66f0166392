-- members.lua: read a group's live members, removing the expired ones in the same step.
--
-- KEYS:
--   KEYS[1]  the group's sorted set <prefix>{<group>}:members (see announce.lua)
--   KEYS[2]  the group's records    <prefix>{<group>}:member-records
-- ARGV:
--   ARGV[1]  the most a reply may carry: identities and records count their bytes, plus 160
--            per member for the framing (kept well below the client's MAX_REPLY_BYTES)
--   ARGV[2]  the longest identity, ARGV[3] the longest record, in bytes: an entry over either
--            (a planted or broken one) is returned as its first 64 bytes and the integer -1,
--            so that one record can neither fail the read nor fill its budget
--
-- Returns {now, earliest, complete, identity 1, record 1, identity 2, record 2, ...}:
--   now       the server's time in milliseconds (TIME)
--   earliest  the earliest expiry among the live members on the same clock, or -1 for none:
--             the reader reads again then (earliest - now ms later)
--   complete  1, or 0 when the budget ran out and the list stops short
--   members   live ones (score > now) in the order of their expiry; a record is nil when a
--             live identity has none, -1 when the entry is over a bound (the reader skips both)

local z, h = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = string.format('%d', now)
-- (HDEL and HMGET take the fields as arguments: at most this many per call, well inside
-- Lua's stack.)
local CHUNK = 1000
local dead = redis.call('ZRANGEBYSCORE', z, '-inf', nows)
if #dead > 0 then
  for i = 1, #dead, CHUNK do
    redis.call('HDEL', h, unpack(dead, i, math.min(i + CHUNK - 1, #dead)))
  end
  redis.call('ZREMRANGEBYSCORE', z, '-inf', nows)
end
local live = redis.call('ZRANGEBYSCORE', z, '(' .. nows, '+inf', 'WITHSCORES')
local out = {now, -1, 1}
if #live == 0 then
  return out
end
out[2] = tonumber(live[2])
local budget = tonumber(ARGV[1])
local max_id, max_rec = tonumber(ARGV[2]), tonumber(ARGV[3])
local used = 0
local ids = {}
for i = 1, #live, 2 do
  ids[#ids + 1] = live[i]
end
for i = 1, #ids, CHUNK do
  local recs = redis.call('HMGET', h, unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
  for j = 1, #recs do
    local id, rec = ids[i + j - 1], recs[j]
    if #id > max_id or (rec and #rec > max_rec) then
      id, rec = string.sub(id, 1, 64), -1
    end
    used = used + #id + 160
    if rec and rec ~= -1 then
      used = used + #rec
    end
    if used > budget then
      out[3] = 0
      return out
    end
    out[#out + 1] = id
    out[#out + 1] = rec
  end
end
return out
