"""Lua scripts: the admission queue, the slot pool, a session's claim, a lease's release, a
session's output write and the gateway's liveness read. Each runs as one atomic Redis step.

Every script touches the keys of one Redis Cluster slot (``streaming/keys.py``): a session's, or
the admission tag's. The admission scripts build some names themselves (a ticket's assignment, a
slot's hold, a worker's or gateway's presence) from ``Keys.admission``, so those carry the same
tag as the keys they are given (the tests check every call: tests/support/script_slots.py).
Ticket ids look like ``ticket_<gateway_id>_<n>``; slot ids like ``<worker_id>|<n>``.
"""

ENQUEUE = """
-- KEYS: queue, queue_seq, free_slots, queue_events, queue_info
-- ARGV: ticket_id, max_queue, front, quiet, mode, cap_s[, score]
-- score: a lost ticket put back (Redis restarted empty) keeps its place in arrival order: it
-- goes in with the score it had, and later tickets number on after it.
-- front = '1': a failover's ticket goes ahead of every ordinary one (in arrival order among
-- themselves), whatever the queue length. quiet = '1': publish nothing (ENQUEUE_DISPATCH
-- publishes `enqueue` itself, only for a ticket that is left waiting). The ticket's mode and
-- the Redis time by which it must have been served (cap_s from now; '' none: 0) go into
-- queue_info as `<mode>|<deadline>`, for the wait estimates (streaming/wait_estimate.py).
local waiting = redis.call('ZCARD', KEYS[1])
local free = redis.call('LLEN', KEYS[3])
local front = ARGV[3] == '1'
if (not front) and waiting - free >= tonumber(ARGV[2]) then
  return -1
end
local seq
if ARGV[7] and ARGV[7] ~= '' then
  seq = tonumber(ARGV[7])
  if seq > tonumber(redis.call('GET', KEYS[2]) or '0') then
    redis.call('SET', KEYS[2], string.format('%d', seq))
  end
else
  seq = redis.call('INCR', KEYS[2])
  if front then
    seq = seq - 1e12
  end
end
redis.call('ZADD', KEYS[1], seq, ARGV[1])
local cap = tonumber(ARGV[6])
local deadline = 0
if cap then
  local t = redis.call('TIME')
  deadline = tonumber(t[1]) + tonumber(t[2]) / 1e6 + cap
end
redis.call('HSET', KEYS[5], ARGV[1], (ARGV[5] or '') .. '|' .. string.format('%.3f', deadline))
if ARGV[4] ~= '1' then
  redis.call('PUBLISH', KEYS[4], 'enqueue')
end
if front then
  return redis.call('ZRANK', KEYS[1], ARGV[1]) + 1
end
return waiting + 1
"""

LEAVE = """
-- KEYS: queue, assignment, queue_events, queue_info   ARGV: ticket_id
-- Returns the slot id when the ticket had already been given one (the caller must release it).
redis.call('HDEL', KEYS[4], ARGV[1])
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('PUBLISH', KEYS[3], 'leave')
  return false
end
local slot = redis.call('GET', KEYS[2])
if slot then
  redis.call('DEL', KEYS[2])
  return slot
end
return false
"""

DISPATCH = """
-- KEYS: queue, free_slots, busy_slots, queue_events, queue_info, running_slots
-- ARGV: prefix, assignment_ttl_s[, by]
-- Pairs the oldest live tickets with live idle slots. Returns {ticket, slot, ticket, slot, ...}.
-- The assignment is recorded even though the caller (gateway `by`) takes its own tickets' slots
-- from this reply: a waiter that was cancelled before it saw the reply gives its slot back
-- through LEAVE, which finds it there. The event names `by` so that gateway skips the claim.
-- The ticket's queue_info moves to running_slots as `<mode>|<deadline>|<dispatched at>`.
local prefix = ARGV[1]
local out = {}
local now = false
while true do
  local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if not head then break end
  local gw = string.match(head, '^ticket_([^_]+)_')
  if (not gw) or redis.call('EXISTS', prefix .. ':gw:' .. gw .. ':alive') == 0 then
    redis.call('ZREM', KEYS[1], head)
    redis.call('HDEL', KEYS[5], head)
  else
    local slot = false
    while true do
      local s = redis.call('RPOP', KEYS[2])
      if not s then break end
      local wid = string.match(s, '^(.*)|[^|]*$')
      if wid and redis.call('EXISTS', prefix .. ':wk:' .. wid .. ':alive') == 1 then
        slot = s
        break
      end
    end
    if not slot then break end
    redis.call('ZREM', KEYS[1], head)
    redis.call('SADD', KEYS[3], slot)
    redis.call('SET', prefix .. ':assign:' .. head, slot, 'EX', tonumber(ARGV[2]))
    redis.call('SET', prefix .. ':hold:' .. slot, head, 'EX', tonumber(ARGV[2]))
    if not now then
      local t = redis.call('TIME')
      now = string.format('%.3f', tonumber(t[1]) + tonumber(t[2]) / 1e6)
    end
    local info = redis.call('HGET', KEYS[5], head) or '|0'
    redis.call('HDEL', KEYS[5], head)
    redis.call('HSET', KEYS[6], slot, info .. '|' .. now)
    table.insert(out, head)
    table.insert(out, slot)
  end
end
if #out > 0 then
  local by = ''
  if ARGV[3] and ARGV[3] ~= '' then by = ' by ' .. ARGV[3] end
  redis.call('PUBLISH', KEYS[4], 'dispatch ' .. table.concat(out, ' ') .. by)
end
return out
"""

RELEASE = """
-- KEYS: busy_slots, free_slots, worker_alive, queue_events, running_slots, duration_stats
-- ARGV: slot_id, prefix[, held_s, alpha]
-- Gives a slot back once (a second release of the same hand-out is a no-op). held_s (the
-- worker's release of a session that ran; '' for a slot that served nobody): the hold is folded
-- into the moving averages of duration_stats, `ema_s` (all modes) and `ema_s:<mode>`, with
-- weight alpha (the `alpha` field of duration_stats when an operator set one); it counts from
-- the dispatch when running_slots knows it, else held_s.
-- (SREM first: at maxmemory a script that has written may go on, so a full Redis still takes
-- the slot back.)
if redis.call('SREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('DEL', ARGV[2] .. ':hold:' .. ARGV[1])
  if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('LREM', KEYS[2], 0, ARGV[1])
    redis.call('LPUSH', KEYS[2], ARGV[1])
  end
  local info = redis.call('HGET', KEYS[5], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
  local held = tonumber(ARGV[3] or '')
  if held then
    local mode = ''
    if info then
      local m, since = string.match(info, '^([^|]*)|[^|]*|([^|]*)$')
      if m and tonumber(since) then
        local t = redis.call('TIME')
        mode = m
        held = math.max(0, tonumber(t[1]) + tonumber(t[2]) / 1e6 - tonumber(since))
      end
    end
    local alpha = tonumber(redis.call('HGET', KEYS[6], 'alpha') or '') or tonumber(ARGV[4])
    local fields = {'ema_s'}
    if mode ~= '' then table.insert(fields, 'ema_s:' .. mode) end
    for _, f in ipairs(fields) do
      local old = tonumber(redis.call('HGET', KEYS[6], f))
      local ema = held
      if old then ema = (1 - alpha) * old + alpha * held end
      redis.call('HSET', KEYS[6], f, string.format('%.3f', ema))
    end
    redis.call('HSET', KEYS[6], 'last_s', string.format('%.3f', held))
  end
  redis.call('PUBLISH', KEYS[4], 'release')
  return 1
end
return 0
"""

OFFER = """
-- KEYS: busy_slots, free_slots, queue_events, running_slots
-- ARGV: prefix, then slot ids idle on their worker
-- Puts idle slots into the pool unless they are already there or handed out. A slot handed out
-- whose hold expired without a session starting on it (its gateway vanished) is taken back; an
-- idle slot runs nothing (its running_slots entry, if any, goes).
local added = 0
for i = 2, #ARGV do
  local s = ARGV[i]
  if redis.call('SISMEMBER', KEYS[1], s) == 1
     and redis.call('EXISTS', ARGV[1] .. ':hold:' .. s) == 0 then
    redis.call('SREM', KEYS[1], s)
  end
  if redis.call('SISMEMBER', KEYS[1], s) == 0 then
    redis.call('HDEL', KEYS[4], s)
    if not redis.call('LPOS', KEYS[2], s) then
      redis.call('LPUSH', KEYS[2], s)
      added = added + 1
    end
  end
end
if added > 0 then redis.call('PUBLISH', KEYS[3], 'offer') end
return added
"""

WITHDRAW = """
-- KEYS: busy_slots, free_slots, queue_events, running_slots   ARGV: slot ids of a worker going away
for i = 1, #ARGV do
  redis.call('LREM', KEYS[2], 0, ARGV[i])
  redis.call('SREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[4], ARGV[i])
end
redis.call('PUBLISH', KEYS[3], 'withdraw')
return #ARGV
"""

# ENQUEUE, then DISPATCH, as one step: a new ticket is taken and paired with an idle slot in one
# round trip (the two scripts' bodies run as local functions). The reply hands the caller its
# slot (no claim round trip); `enqueue` is published only when the ticket is left waiting (a
# ticket served at once changed no position, and nothing is left to dispatch after this step).
ENQUEUE_DISPATCH = (
    "local function enqueue(KEYS, ARGV)\n"
    + ENQUEUE
    + "\nend\nlocal function dispatch(KEYS, ARGV)\n"
    + DISPATCH
    + """
end
-- KEYS: queue, queue_seq, free_slots, queue_events, busy_slots, queue_info, running_slots
-- ARGV: ticket_id, max_queue, front, prefix, assignment_ttl_s, mode, cap_s
-- Returns {position (-1: full, nothing dispatched), ticket, slot, ticket, slot, ...}.
-- The dispatching gateway (named in the `dispatch` event) is the ticket's own.
local pos = enqueue(
  {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]}, {ARGV[1], ARGV[2], ARGV[3], '1', ARGV[6], ARGV[7]}
)
if pos < 0 then
  return {pos}
end
local by = string.match(ARGV[1], '^ticket_([^_]+)_') or ''
local out = dispatch({KEYS[1], KEYS[3], KEYS[5], KEYS[4], KEYS[6], KEYS[7]}, {ARGV[4], ARGV[5], by})
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('PUBLISH', KEYS[4], 'enqueue')
end
table.insert(out, 1, pos)
return out
"""
)

CLAIM_SESSION = """
-- KEYS: session_claim, session_lease[, chat_request]
-- ARGV: worker_id, claim_ttl_s, lease_ttl_ms, slot_id (the lease's holder)
-- A worker starts a session in one step: the claim (SET NX: a session never runs twice), then the
-- session lease, then (a chat turn) its request, read once. A failed claim changes nothing: no
-- lease, the request left for nobody. Returns false when the claim failed, else {1} or
-- {1, request} (the request is false when it expired or Redis lost it). (The slot's hold, an
-- admission key, is the caller's next command: streaming/session_claim.py.)
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  return false
end
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[3])
if KEYS[3] then
  return {1, redis.call('GETDEL', KEYS[3])}
end
return {1}
"""

TAKE_LEASE = """
-- KEYS[1] a lease[, KEYS[2] a hash]; ARGV: holder, ttl_ms, owner[, field, value]
-- Taken (or renewed) when free, held by ARGV[1] already, or held by another hold of the same
-- owner (a value starting with ARGV[3]; empty: none), one still being given back: returns 1;
-- else left as it is: 0. The hash field, when given, is set either way, in the same step.
if KEYS[2] then
  redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
end
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1]
    or (ARGV[3] ~= '' and string.sub(holder, 1, string.len(ARGV[3])) == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

END_LEASE = """
-- KEYS: a session's lease, then its other keys to drop with it; ARGV[1]: the lease's holder
-- All are deleted while the lease is that holder's or gone; one that another holder has now
-- (the session was restarted on another slot) is left, and its keys with it: returns 0.
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('DEL', unpack(KEYS))
  return 1
end
return 0
"""

DELETE_IF_HELD = """
-- KEYS[1] a lease; ARGV[1] who gives it back: deleted only while that one still holds it
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

LIVENESS = """
-- KEYS: session leases, then resume records   ARGV: how many leases, then for each resume
-- record the connection asking about it
-- The gateway's liveness questions of one tick in one step. Returns one character per key:
-- a lease '1' held, '0' gone; a resume record '1' another connection holds the session (its
-- `conn` is set, not empty and not the asker's), '2' nobody does (`conn` empty: detached),
-- '3' there is no record (Redis lost it: the asker writes it again), '0' the asker does; then
-- Redis's clock (TIME: seconds, microseconds), which tells a stall of Redis from one of the gateway
-- (streaming/stalls.py). One command a tick for Redis, where a pipeline brought two per session.
local leases = tonumber(ARGV[1])
local out = {}
for i = 1, leases do
  out[i] = redis.call('EXISTS', KEYS[i]) == 1 and '1' or '0'
end
for i = leases + 1, #KEYS do
  local conn = redis.call('HGET', KEYS[i], 'conn')
  if conn == '' then
    out[i] = '2'
  elseif not conn then
    out[i] = '3'
  else
    out[i] = (conn and conn ~= ARGV[i - leases + 1]) and '1' or '0'
  end
end
local now = redis.call('TIME')
return {table.concat(out), now[1], now[2]}
"""

OUTPUT_WRITE = """
-- KEYS: output_log, output_channel (one session's)
-- ARGV: ttl_s ('0': leave the log's expiry), minid ('': trim nothing), then seq, event pairs
-- Each event is published, then logged as entry <seq>-1, the log trimmed to the entries from
-- minid on: one copy of each event's bytes into Redis for both. An id already logged (a batch
-- retried after a lost reply) is published again and not logged again: the gateway skips a seq
-- it has. Any other error of XADD ends the script with that error.
local minid = ARGV[2]
for i = 3, #ARGV, 2 do
  redis.call('PUBLISH', KEYS[2], ARGV[i + 1])
  local got
  if minid == '' then
    got = redis.pcall('XADD', KEYS[1], ARGV[i] .. '-1', 'e', ARGV[i + 1])
  else
    got = redis.pcall('XADD', KEYS[1], 'MINID', minid, ARGV[i] .. '-1', 'e', ARGV[i + 1])
  end
  if type(got) == 'table' and got.err and not string.find(got.err, 'equal or smaller', 1, true) then
    return got
  end
end
if ARGV[1] ~= '0' then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return 1
"""

# the same on a Redis Cluster, where a session's channel is a sharded one, on its slot's shard
OUTPUT_WRITE_SHARDED = OUTPUT_WRITE.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")
