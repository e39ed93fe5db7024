"""Lua scripts that change a session, so every change is atomic and applies once.

Every script gets the same keys and leading arguments:
KEYS = messages list, meta hash, ops sorted set, summary string, session index;
ARGV = op id, now (unix s), idle ttl (s), ops bound, session key, then its own.
The op id of each write is remembered in the ops set (bounded): redis-py retries a
command whose reply was lost, and the retry must not apply the change a second time.
"""

from __future__ import annotations

_PRELUDE = """
local messages, meta, ops, summary, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local op, now, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local ops_bound, session_key = tonumber(ARGV[4]), ARGV[5]

local function applied()
  return redis.call('ZSCORE', ops, op)
end

local function push_from(first)
  local n = redis.call('LLEN', messages)
  local i = first
  while i <= #ARGV do
    local j = math.min(i + 999, #ARGV)
    n = redis.call('RPUSH', messages, unpack(ARGV, i, j))
    i = j + 1
  end
  return n
end

local function cap(n, max_messages)
  if n > max_messages then
    redis.call('LTRIM', messages, -max_messages, -1)
    redis.call('HINCRBY', meta, 'trimmed', n - max_messages)
  end
end

-- ids: the op ids applied (default: this script's one).
local function touch(bump_version, ids)
  redis.call('HSETNX', meta, 'created_at', ARGV[2])
  redis.call('HSET', meta, 'last_activity', ARGV[2])
  if bump_version then
    redis.call('HINCRBY', meta, 'version', 1)
  end
  for _, id in ipairs(ids or {op}) do
    local seq = redis.call('HINCRBY', meta, 'op_seq', 1)
    redis.call('ZADD', ops, seq, id)
  end
  redis.call('ZREMRANGEBYRANK', ops, 0, -(ops_bound + 1))
  redis.call('ZADD', index, ARGV[2], session_key)
  redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. tostring(now - ttl))
  for _, key in ipairs({messages, meta, ops, summary}) do
    redis.call('EXPIRE', key, ttl)
  end
end
"""

# ARGV[6] = max messages kept, ARGV[7..] = messages as JSON. 1 = appended, 0 = already applied.
APPEND = (
    _PRELUDE
    + """
if applied() then
  return 0
end
cap(push_from(7), tonumber(ARGV[6]))
touch(#ARGV >= 7)
return 1
"""
)

# ARGV[6] = expected length, ARGV[7] = expected version or '', ARGV[8] = summary,
# ARGV[9] = max messages, ARGV[10..] = kept messages. 1 = replaced (now or before), 0 = refused.
REPLACE_AFTER_COMPACTION = (
    _PRELUDE
    + """
if applied() then
  return 1
end
if redis.call('LLEN', messages) ~= tonumber(ARGV[6]) then
  return 0
end
if ARGV[7] ~= '' and tonumber(redis.call('HGET', meta, 'version') or '0') ~= tonumber(ARGV[7]) then
  return 0
end
redis.call('DEL', messages)
cap(push_from(10), tonumber(ARGV[9]))
redis.call('SET', summary, ARGV[8])
redis.call('HINCRBY', meta, 'compactions', 1)
-- The last call's usage measured the old history: the next estimate must not start from it.
redis.call('HSET', meta, 'last_prompt_tokens', 0, 'last_completion_tokens', 0)
redis.call('HSET', meta, 'last_compaction_at', ARGV[2])
touch(true)
return 1
"""
)

# No own arguments. 1 = reset (now or before), 0 = there was no session.
RESET = (
    _PRELUDE
    + """
if applied() then
  return 1
end
if redis.call('EXISTS', meta) == 0 and redis.call('EXISTS', messages) == 0 then
  return 0
end
redis.call('DEL', messages, summary)
redis.call('HINCRBY', meta, 'resets', 1)
redis.call('HSET', meta, 'compactions', 0, 'trimmed', 0, 'last_prompt_tokens', 0,
           'last_completion_tokens', 0)
touch(true)
return 1
"""
)

# The usage writes, for the scripts that record usage: one LLM call's tokens, and a run's
# totals with its cost ('' when unpriced).
_USAGE = """
local function add_call(prompt, completion)
  redis.call('HSET', meta, 'last_prompt_tokens', prompt, 'last_completion_tokens', completion)
  redis.call('HINCRBY', meta, 'total_prompt_tokens', prompt)
  redis.call('HINCRBY', meta, 'total_completion_tokens', completion)
end

local function set_run(prompt, completion, cost)
  redis.call('HSET', meta, 'last_run_prompt_tokens', prompt, 'last_run_completion_tokens', completion,
             'last_run_cost', cost)
  if cost ~= '' then
    redis.call('HINCRBYFLOAT', meta, 'total_cost', cost)
  end
end
"""

# ARGV[6] = prompt tokens, ARGV[7] = completion tokens. 1 = recorded, 0 = already applied.
RECORD_USAGE = (
    _PRELUDE
    + _USAGE
    + """
if applied() then
  return 0
end
add_call(ARGV[6], ARGV[7])
touch(false)
return 1
"""
)

# ARGV[6] = the run's prompt tokens, ARGV[7] = its completion tokens, ARGV[8] = its cost
# or ''. 1 = recorded, 0 = already applied.
RECORD_RUN = (
    _PRELUDE
    + _USAGE
    + """
if applied() then
  return 0
end
set_run(ARGV[6], ARGV[7], ARGV[8])
touch(false)
return 1
"""
)

# A finished run in one script, each part applied once under the op id the single
# scripts use (so it composes with them): the append (a:<run>, as APPEND), one usage
# record per LLM call (u:<run>:<i>, as RECORD_USAGE) and, with any calls, the run's
# totals (run:<run>, as RECORD_RUN); one round of bookkeeping for all of them.
# ARGV[1] = the run id, ARGV[6] = max messages kept, ARGV[7] = n calls, then n pairs
# (prompt, completion tokens), then with n > 0 the run's prompt, completion and cost
# (or ''), then the messages as JSON. Returns {stored message count, compactions}.
RECORD_FINISHED_RUN = (
    _PRELUDE
    + _USAGE
    + """
local calls = tonumber(ARGV[7])
local totals = 8 + 2 * calls
local first_message = calls > 0 and totals + 3 or totals
local done = {}
local function fresh(id)
  if redis.call('ZSCORE', ops, id) then
    return false
  end
  done[#done + 1] = id
  return true
end
local appended = false
if fresh('a:' .. op) then
  cap(push_from(first_message), tonumber(ARGV[6]))
  appended = #ARGV >= first_message
end
for i = 1, calls do
  if fresh('u:' .. op .. ':' .. (i - 1)) then
    add_call(ARGV[6 + 2 * i], ARGV[7 + 2 * i])
  end
end
if calls > 0 and fresh('run:' .. op) then
  set_run(ARGV[totals], ARGV[totals + 1], ARGV[totals + 2])
end
if #done > 0 then
  touch(appended, done)
end
return {redis.call('LLEN', messages), tonumber(redis.call('HGET', meta, 'compactions') or '0')}
"""
)
