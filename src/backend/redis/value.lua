-- value.lua: what every script (acquire, renew, release, inspect) starts with: the test of
-- whether a lock key's value is tenure's. engine.rs loads it before each script's own text,
-- so one definition checks the layout everywhere. The layout is described in acquire.lua.

local NONE = '--------------------------------'
-- Whether v is a value of tenure's: the layout in acquire.lua, position by position, and a fencing
-- token of 1 to 19 digits. One greedy match runs over the hex digits from position 2: the
-- holder token and the mark, then the previous holder token and the fencing digits unless that
-- token is NONE; the digits must end where the ':' is.
local function ours(v)
  local _, e = string.find(v, '^[+~][0-9a-f]+')
  local mark = string.byte(v, 34)
  if not e or (mark ~= 48 and mark ~= 49) then
    return false
  end
  if e == 34 then
    local _, none = string.find(v, '^%-+', 35)
    if none ~= 66 then
      return false
    end
  elseif e < 67 then
    return false
  end
  local _, sep = string.find(v, '^%d+:', 67)
  return sep ~= nil and sep <= 86 and (e == 34 or sep == e + 1)
end
