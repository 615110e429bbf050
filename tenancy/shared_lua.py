"""The Lua scripts of the Redis-backed tenant limits and ledger (issue 16), and their argument codec.

Each script performs exactly the arithmetic of :class:`tenancy.limits.TokenBucket`
and :class:`tenancy.ledger.InProcessLedger` on Redis hashes (see
:mod:`tenancy.shared` for the key layout); numbers travel as ``%.17g``
strings so doubles are exact. Registered by :class:`tenancy.shared_store.Store`.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ADJUST", "ADMIT", "APPLY", "COUNT", "LEVEL", "RENEW", "RESERVE", "SLOT", "TAKE", "arg", "int_reply", "malformed",
           "wait_reply"]

# ZADD of the lease members of a request (ADMIT, SLOT)
_LUA_ZADD_ALL = r"""
-- ZADD key score ARGV[first..] in calls of at most 500 members (unpack stays far below Lua's C stack limit)
local function zadd_all(key, score, first)
  local i = first
  while i <= #ARGV do
    local z = {}
    for j = i, math.min(i + 499, #ARGV) do z[#z + 1] = score; z[#z + 1] = ARGV[j] end
    redis.call('ZADD', key, unpack(z))
    i = i + 500
  end
end
"""

# Shared helpers: a bucket is a hash {level, updated, rate, burst}; numbers travel as %.17g strings
# (exact doubles; a Lua number returned as a reply would be truncated to an integer).
_LUA_LIB = _LUA_ZADD_ALL + r"""
local function num(x) return string.format('%.17g', x) end
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- TokenBucket(rate, burst, now) or the stored one, reconfigured (refill at the old rate, capped at the
-- old burst, then capped at the new one) and refilled to now, exactly as tenancy/limits.py
local function load(key, rate, burst, now)
  local v = redis.call('HMGET', key, 'level', 'updated', 'rate', 'burst')
  if not v[1] then return burst, now end
  local level, updated = tonumber(v[1]), tonumber(v[2])
  local orate, oburst = tonumber(v[3]), tonumber(v[4])
  if now > updated then
    level = math.min(oburst, level + (now - updated) * orate)
    updated = now
  end
  if orate ~= rate or oburst ~= burst then level = math.min(level, burst) end
  return level, updated
end
local function bucket_ttl_ms(level, rate, burst)
  local full_s = 0
  if level < burst then full_s = (burst - level) / rate end
  return math.floor((full_s + 3600) * 1000)
end
local function store(key, level, updated, rate, burst)
  redis.call('HSET', key, 'level', num(level), 'updated', num(updated), 'rate', num(rate), 'burst', num(burst))
  redis.call('PEXPIRE', key, bucket_ttl_ms(level, rate, burst))
end
-- try_take: need < 0 means "can never succeed" (n > burst without debt); returns wait seconds (0: taken)
local function take(key, rate, burst, now, n, need)
  local level, updated = load(key, rate, burst, now)
  local wait = 0
  if need < 0 then wait = -1
  elseif level >= need then level = level - n
  else wait = (need - level) / rate end
  store(key, level, updated, rate, burst)
  return wait
end
local function wait_reply(reason, wait)
  if wait < 0 then return {reason, 'inf'} end
  return {reason, num(wait)}
end
"""

# KEYS: conc zset, request bucket[, ledger prompt-token bucket (session 10: passed only for a tenant with a
# prompt-token rate: tenancy/prompt_room.py shared_room ignores it otherwise)].
# ARGV: now|'', max_conc (-1: none), rate|'', burst, n, need, drop_unlimited (1: delete the bucket when rate
# is ''), lease_ttl_ms, member...
# Admitted with a third key that exists: {'ok', '0', level refilled to now (not stored), rate, burst} of that
# bucket, read in the same round trip for the early prompt-token check (tenancy/prompt_room.py shared_room).
# Session 8: with no member to add and no count to check (a request admitted without its slot, flow
# control), the slot set is not touched (no prune, no expiry renewal: nothing of it is read or added).
_LUA_ADMIT = _LUA_LIB + r"""
local now, now_ms = server_now()
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) end
local maxc = tonumber(ARGV[2])
local members = #ARGV - 8
if maxc >= 0 or members > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms) end
if maxc >= 0 and redis.call('ZCARD', KEYS[1]) + members > maxc then return {'concurrency', '1'} end
if ARGV[3] ~= '' then
  local wait = take(KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4]), now, tonumber(ARGV[5]), tonumber(ARGV[6]))
  if wait ~= 0 then return wait_reply('rate', wait) end
elseif ARGV[7] == '1' then
  redis.call('DEL', KEYS[2])
end
if members > 0 then
  local ttl = tonumber(ARGV[8])
  zadd_all(KEYS[1], now_ms + ttl, 9)
  redis.call('PEXPIRE', KEYS[1], ttl * 3)
end
if KEYS[3] then
  local v = redis.call('HMGET', KEYS[3], 'level', 'updated', 'rate', 'burst')
  if v[1] then
    local level, updated, rate, burst = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]), tonumber(v[4])
    if now > updated then level = math.min(burst, level + (now - updated) * rate) end
    return {'ok', '0', num(level), num(rate), num(burst)}
  end
end
return {'ok', '0'}
"""

# Session 8: the concurrency slots of an admitted request (TenantLimiter.take_slots), alone: what ADMIT
# did with no rate bucket, without its bucket library. KEYS: conc zset. ARGV: max_conc (-1: none),
# lease_ttl_ms, member... Returns {'ok', '0'} or {'concurrency', '1'} (nothing added).
_LUA_SLOT = _LUA_ZADD_ALL + r"""
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local maxc = tonumber(ARGV[1])
local members = #ARGV - 2
if maxc >= 0 and redis.call('ZCARD', KEYS[1]) + members > maxc then return {'concurrency', '1'} end
if members > 0 then
  local ttl = tonumber(ARGV[2])
  zadd_all(KEYS[1], now_ms + ttl, 3)
  redis.call('PEXPIRE', KEYS[1], ttl * 3)
end
return {'ok', '0'}
"""

# KEYS: conc zset. ARGV: lease_ttl_ms, member... Returns how many members were still held.
# Session 17 (S17-9): a member found missing (expired, or its set evicted by a Redis eviction policy) is
# added back: the request it counts is still running here, so the tenant's count is rebuilt within one
# renewal interval; the missing ones are still counted (RedisTenantLimiter.lost_slots). Session 18: a
# member is counted held by ZSCORE (``ZADD XX CH`` counted one renewed within the millisecond of its last
# score, unchanged, as lost).
_LUA_RENEW = _LUA_LIB + r"""
local now, now_ms = server_now()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local ttl = tonumber(ARGV[1])
local held = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then held = held + 1 end
  redis.call('ZADD', KEYS[1], now_ms + ttl, ARGV[i])
end
if #ARGV > 1 then redis.call('PEXPIRE', KEYS[1], ttl * 3) end
return held
"""

# KEYS: conc zset. Returns the live slot count (expired ones pruned).
_LUA_COUNT = _LUA_LIB + r"""
local now, now_ms = server_now()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
return redis.call('ZCARD', KEYS[1])
"""

# KEYS: bucket. ARGV: now|'', rate, burst, n, need.
_LUA_TAKE = _LUA_LIB + r"""
local now = server_now()
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) end
local wait = take(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), now, tonumber(ARGV[4]), tonumber(ARGV[5]))
if wait ~= 0 then return wait_reply('rate', wait) end
return {'ok', '0'}
"""

# KEYS: bucket. ARGV: now|''. The level refilled to now, stored like TokenBucket.refill does
# (InProcessLedger.level stores the refill too). Returns false for no bucket.
_LUA_LEVEL = _LUA_LIB + r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local now = server_now()
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) end
local v = redis.call('HMGET', KEYS[1], 'rate', 'burst')
local rate, burst = tonumber(v[1]), tonumber(v[2])
local level, updated = load(KEYS[1], rate, burst, now)
store(KEYS[1], level, updated, rate, burst)
return num(level)
"""

# KEYS: prompt bucket, output bucket, totals, tenants set.
# ARGV: now|'', prate|'', pburst, p, orate|'', oburst, o, tenant id
_LUA_RESERVE = _LUA_LIB + r"""
-- session 10: the server clock only when a limited bucket needs it (no TIME for unlimited tokens)
local now = nil
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) end
redis.call('SADD', KEYS[4], ARGV[8])
local specs = {{KEYS[1], ARGV[2], ARGV[3], ARGV[4], 'tenant_prompt_tokens'},
               {KEYS[2], ARGV[5], ARGV[6], ARGV[7], 'tenant_output_tokens'}}
local levels = {}
local maxwait, reason = 0, nil
local unlimited = {}
for i, s in ipairs(specs) do
  if s[2] == '' then
    unlimited[#unlimited + 1] = s[1]
  else
    local rate, burst, n = tonumber(s[2]), tonumber(s[3]), tonumber(s[4])
    if now == nil then now = server_now() end
    local level, updated = load(s[1], rate, burst, now)
    store(s[1], level, updated, rate, burst)
    levels[i] = {level, updated, rate, burst, n}
    local need = math.min(n, burst)
    if level < need then
      local wait = (need - level) / rate
      if reason == nil then reason = s[5] end
      if wait > maxwait then maxwait = wait end
    end
  end
end
if #unlimited > 0 then redis.call('DEL', unpack(unlimited)) end
if reason ~= nil then return {reason, num(maxwait)} end
for i, s in ipairs(specs) do
  local b = levels[i]
  if b then store(s[1], b[1] - b[5], b[2], b[3], b[4]) end
end
-- a zero increment is not written: an absent field reads as 0 (RedisLedger.totals)
if tonumber(ARGV[4]) ~= 0 then redis.call('HINCRBY', KEYS[3], 'reserved_prompt', ARGV[4]) end
if tonumber(ARGV[7]) ~= 0 then redis.call('HINCRBY', KEYS[3], 'reserved_output', ARGV[7]) end
redis.call('HINCRBY', KEYS[3], 'open', 1)
return {'ok', '0'}
"""

# adjust(prompt bucket, output bucket, totals, a, now): a = {d_prompt, d_output, mode (lower|settle),
# charged_prompt, charged_output, refunded_prompt, refunded_output}. tenancy/ledger.py
# InProcessLedger._adjust: refill to the settle time first (what accrued since the last take must not
# absorb an overshoot), then debt or a refund capped at the burst.
_LUA_ADJUST_FN = r"""
local function adjust(kp, ko, kt, a, now)
  local deltas = {tonumber(a[1]), tonumber(a[2])}
  local buckets = {kp, ko}
  for i = 1, 2 do
    local d = deltas[i]
    if d ~= 0 and redis.call('EXISTS', buckets[i]) == 1 then
      local v = redis.call('HMGET', buckets[i], 'rate', 'burst')
      local rate, burst = tonumber(v[1]), tonumber(v[2])
      local level, updated = load(buckets[i], rate, burst, now)
      if d > 0 then level = level - d else level = math.min(burst, level - d) end
      store(buckets[i], level, updated, rate, burst)
    end
  end
  if a[3] == 'lower' then
    if deltas[2] ~= 0 then redis.call('HINCRBY', kt, 'refunded_output', -deltas[2]) end
    return 1
  end
  -- open = max(0, open - 1) in one call (session 10; was HGET + HSET): HSET only below 0
  if redis.call('HINCRBY', kt, 'open', -1) < 0 then redis.call('HSET', kt, 'open', 0) end
  -- a zero increment is not written: an absent field reads as 0 (RedisLedger.totals)
  local fields = {'charged_prompt', 'charged_output', 'refunded_prompt', 'refunded_output'}
  for k = 1, 4 do
    if tonumber(a[k + 3]) ~= 0 then redis.call('HINCRBY', kt, fields[k], a[k + 3]) end
  end
  return 1
end
"""

# KEYS: prompt bucket, output bucket, totals. ARGV: d_prompt, d_output, mode (lower|settle),
# charged_prompt, charged_output, refunded_prompt, refunded_output, now|''. One adjust().
_LUA_ADJUST = _LUA_LIB + _LUA_ADJUST_FN + r"""
local now = server_now()
if ARGV[8] ~= '' then now = tonumber(ARGV[8]) end
return adjust(KEYS[1], KEYS[2], KEYS[3], ARGV, now)
"""

# The writer's queued updates of one tenant, in order, in one call (tenancy/shared_store.py Writer).
# KEYS: conc zset, prompt bucket, output bucket, totals (all of one tenant). ARGV: a list of updates,
# each 'r', n, member x n (release: ZREM of a lease's slots) or 'a', then ADJUST's 8 arguments (a
# settle or a lower). Each update runs protected: one Redis refuses is skipped, the others applied.
# Returns the number of updates refused.
_LUA_APPLY = _LUA_LIB + _LUA_ADJUST_FN + r"""
local refused = 0
local i = 1
local server = nil
while i <= #ARGV do
  if ARGV[i] == 'r' then
    local n = tonumber(ARGV[i + 1])
    local j = i + 2
    while j < i + 2 + n do
      local last = math.min(j + 999, i + 1 + n)
      if not pcall(redis.call, 'ZREM', KEYS[1], unpack(ARGV, j, last)) then refused = refused + 1 end
      j = last + 1
    end
    i = i + 2 + n
  elseif ARGV[i] == 'a' then
    local a = {ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7]}
    local now
    if ARGV[i + 8] ~= '' then now = tonumber(ARGV[i + 8])
    else
      if server == nil then server = server_now() end
      now = server
    end
    if not pcall(adjust, KEYS[2], KEYS[3], KEYS[4], a, now) then refused = refused + 1 end
    i = i + 9
  else
    return redis.error_reply('APPLY: unknown update ' .. tostring(ARGV[i]))
  end
end
return refused
"""


def arg(x: float | None) -> str:
    """A number as a script argument (``''`` for None), exact for doubles."""
    return "" if x is None else repr(float(x))


#: The first element of a verdict reply of ADMIT / SLOT / TAKE / RESERVE.
REASONS = frozenset({"ok", "rate", "concurrency", "tenant_prompt_tokens", "tenant_output_tokens"})


def malformed(what: str) -> Exception:
    """The error for a reply that is not what the script returns: redis-py's ``InvalidResponse``
    (a :class:`redis.exceptions.RedisError`, i.e. "Redis unavailable" for the failover wrapper,
    :func:`tenancy.shared_failover.unavailable_errors`), never a tenant's verdict (S17-8)."""
    from redis.exceptions import InvalidResponse

    return InvalidResponse(f"malformed reply to a state script: {what}")


def wait_reply(reply: Any) -> tuple[str, float]:
    """``(reason, wait seconds)`` of a verdict reply: ``[reason, wait]`` (``wait`` a ``%.17g`` number >= 0
    or ``inf``), or ADMIT's ``['ok', '0', level, rate, burst]`` (three finite numbers).

    Raises:
        redis.exceptions.InvalidResponse: any other shape (a wrong service or a broken proxy on
            ``state.url``): Redis unavailable, not the tenant's limit (S17-8).
    """
    if not isinstance(reply, (list, tuple)) or len(reply) not in (2, 5):
        raise malformed(type(reply).__name__ if not isinstance(reply, (list, tuple)) else f"{len(reply)} elements")
    try:
        parts = [x.decode("ascii") if isinstance(x, bytes) else x for x in reply]
        if not all(isinstance(x, str) for x in parts):
            raise ValueError
        reason, wait = parts[0], float(parts[1])
        extra = [float(x) for x in parts[2:]]
    except (UnicodeDecodeError, ValueError):
        raise malformed("not a verdict") from None
    if (reason not in REASONS or not wait >= 0 or (math.isinf(wait) and parts[1] != "inf")
            or (extra and (reason != "ok" or not all(math.isfinite(x) for x in extra)))):
        raise malformed("not a verdict")
    return reason, wait


def int_reply(reply: Any, low: int = 0, high: int | None = None) -> int:
    """An integer reply of RENEW / COUNT in ``low .. high``.

    Raises:
        redis.exceptions.InvalidResponse: anything else (S17-8).
    """
    if isinstance(reply, bool) or not isinstance(reply, int) or reply < low or (high is not None and reply > high):
        raise malformed("not a count")
    return reply


ADMIT, RENEW, COUNT, TAKE, LEVEL, RESERVE, ADJUST, APPLY = (_LUA_ADMIT, _LUA_RENEW, _LUA_COUNT, _LUA_TAKE,
                                                            _LUA_LEVEL, _LUA_RESERVE, _LUA_ADJUST, _LUA_APPLY)
SLOT = _LUA_SLOT
