/**
 * The snapshot store's Lua scripts. Each is one compare-and-set that Redis runs atomically: the
 * check (the stored version, a list's length) and every write (the envelope, the event stream,
 * list appends) happen with no other command in between, and are propagated to replicas and the
 * append-only file as one transaction.
 *
 * Why scripts and not WATCH/MULTI/EXEC: WATCH belongs to a connection, so every concurrent
 * transaction needs a connection of its own, and each commit then costs two round trips and the
 * system calls of a socket that shares nothing with the others. Measured on one 2-core machine
 * with 32 commits in flight: about 109 µs of client CPU per commit with WATCH/MULTI on dedicated
 * connections, 19 µs with a script on the shared connection (one round trip, pipelined with every
 * other command). The guarantee is the same: the write happens only if the version is unchanged.
 * @internal
 */

/** Bump when a script changes meaning, so clients never mix versions under one command name. */
export const SNAPSHOT_SCRIPT_VERSION = 6;

// The status changes a run's status stream keeps (a waiter needs only the newest).
const STATUS_KEPT = 16;

// Appends an event to the run's stream, and a status change to its status stream too.
const APPEND = `
local function append(events, status, v, t, d)
  redis.call('XADD', events, '*', 'v', v, 't', t, 'd', d)
  if t == 'run.status' then
    redis.call('XADD', status, 'MAXLEN', '${STATUS_KEPT}', '*', 'v', v, 't', t, 'd', d)
  end
end
`;

// Runs `cmd key ARGV[from .. from+count-1]` in chunks (Lua's unpack has a stack limit); `count`
// and the chunk size are even, so field/value pairs never straddle two calls.
const CHUNKED = `
local function chunked(cmd, key, from, count)
  local i = from
  local last = from + count - 1
  while i <= last do
    local j = math.min(i + 999, last)
    redis.call(cmd, key, unpack(ARGV, i, j))
    i = j + 1
  end
end
`;

/*
 * create: writes version 0 of a new run.
 *   KEYS[1]  snap (HASH)   KEYS[2]  events (STREAM)   KEYS[3]  meta (HASH)   KEYS[4]  outputs (HASH)
 *   KEYS[5]  status (STREAM: the `run.status` events again)
 *   ARGV[1]  sv   ARGV[2] u (updatedAt)
 *   ARGV[3]  p, the number of snapshot field/value strings, then p strings
 *   then     o, the number of output field/value strings, then o strings
 *   then     n, the number of events, then n pairs (type, JSON)
 *   then     m, the number of meta field/value strings, then m strings
 *   Returns  1 when created; 0 when snap exists (nothing written)
 */
const CREATE = `${CHUNKED}${APPEND}
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'v', '0', 'sv', ARGV[1], 'u', ARGV[2])
local i = 3
local p = tonumber(ARGV[i])
if p > 0 then chunked('HSET', KEYS[1], i + 1, p) end
i = i + 1 + p
local o = tonumber(ARGV[i])
if o > 0 then chunked('HSET', KEYS[4], i + 1, o) end
i = i + 1 + o
local n = tonumber(ARGV[i])
i = i + 1
for _ = 1, n do
  append(KEYS[2], KEYS[5], '0', ARGV[i], ARGV[i + 1])
  i = i + 2
end
local m = tonumber(ARGV[i])
if m > 0 then redis.call('HSET', KEYS[3], unpack(ARGV, i + 1, i + m)) end
return 1
`;

/*
 * commit: compare-and-set of the snapshot's changed fields, the step outputs, the event appends,
 * any list appends and ledger receipts of read-only calls, all or nothing.
 *   KEYS[1]  snap (HASH)   KEYS[2]  events (STREAM)   KEYS[3]  outputs (HASH)
 *   KEYS[4]  the run's unit notes (HASH)   KEYS[5]  status (STREAM: the `run.status` events again)
 *   KEYS[6..] lists, then the ledger hash of each receipt (the last r keys)
 *   ARGV[1]  the expected version   ARGV[2] the new version   ARGV[3] sv   ARGV[4] u
 *   ARGV[5]  the carrier note ('' leaves the stored one as it is)
 *   ARGV[6]  mode: 'p' the changed fields only, valid only over fields of the same schema version
 *            (sv); 'f' every field (the old one-field snapshot `s` is removed); 'w' no check
 *   ARGV[7]  a unit note's field ('' none), ARGV[8] its value: the note of the unit this commit
 *            hands to its own job (see the unit notes), written instead of by that unit's start
 *   ARGV[9]  p, the number of snapshot field/value strings, then p strings
 *   then     o, the number of output field/value strings, then o strings
 *   then     d, the number of output fields to delete, then d names
 *   then     n, the number of events, then n pairs (type, JSON)
 *   then     r, the number of ledger receipts, then r quadruples (call id, entry JSON, tool,
 *            args hash): each is written as the ledger's record script writes it (a new entry
 *            gets its seq and times; a receipt already there stays; another tool or other
 *            arguments leave the entry as it is)
 *   then, per list key: its expected length, the number of values c, then c values
 *   Returns  {1} written; {0, stored version} version differs; {-1} no snap;
 *            {2, list index (0-based), actual length} a list's length differs;
 *            {3} mode 'p' over fields of another schema version (write every field instead).
 *            Only {1} writes.
 */
const COMMIT = `${CHUNKED}${APPEND}
local stored = redis.call('HGET', KEYS[1], 'v')
if not stored then return {-1} end
if stored ~= ARGV[1] then return {0, stored} end
if ARGV[6] == 'p' and redis.call('HGET', KEYS[1], 'sv') ~= ARGV[3] then return {3} end
local i = 9
local p = tonumber(ARGV[i])
local partsAt = i + 1
i = i + 1 + p
local o = tonumber(ARGV[i])
local outputsAt = i + 1
i = i + 1 + o
local d = tonumber(ARGV[i])
local dropAt = i + 1
i = i + 1 + d
local n = tonumber(ARGV[i])
local eventsAt = i + 1
i = i + 1 + 2 * n
local r = tonumber(ARGV[i])
local receiptsAt = i + 1
i = i + 1 + 4 * r
local lastList = #KEYS - r
local lists = {}
for k = 6, lastList do
  local expected = tonumber(ARGV[i])
  local count = tonumber(ARGV[i + 1])
  local len = redis.call('LLEN', KEYS[k])
  if len ~= expected then return {2, k - 6, len} end
  lists[#lists + 1] = {KEYS[k], i + 2, count}
  i = i + 2 + count
end
if ARGV[6] == 'f' then redis.call('HDEL', KEYS[1], 's') end
if ARGV[5] == '' then
  redis.call('HSET', KEYS[1], 'v', ARGV[2], 'sv', ARGV[3], 'u', ARGV[4])
else
  redis.call('HSET', KEYS[1], 'v', ARGV[2], 'sv', ARGV[3], 'u', ARGV[4], 'c', ARGV[5])
end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[4], ARGV[7], ARGV[8]) end
if p > 0 then chunked('HSET', KEYS[1], partsAt, p) end
if o > 0 then chunked('HSET', KEYS[3], outputsAt, o) end
if d > 0 then chunked('HDEL', KEYS[3], dropAt, d) end
i = eventsAt
for _ = 1, n do
  append(KEYS[2], KEYS[5], ARGV[2], ARGV[i], ARGV[i + 1])
  i = i + 2
end
for _, l in ipairs(lists) do
  if l[3] > 0 then chunked('RPUSH', l[1], l[2], l[3]) end
end
local now = tonumber(ARGV[4])
for j = 1, r do
  local key = KEYS[lastList + j]
  local at = receiptsAt + 4 * (j - 1)
  local raw = redis.call('HGET', key, ARGV[at])
  local e = nil
  if not raw then
    e = cjson.decode(ARGV[at + 1])
    e.seq = redis.call('HLEN', key) + 1
    e.createdAt = now
  else
    local old = cjson.decode(raw)
    if old.state ~= 'SUCCEEDED' and old.tool == ARGV[at + 2] and old.argsHash == ARGV[at + 3] then
      local fresh = cjson.decode(ARGV[at + 1])
      e = old
      e.state = fresh.state
      e.runs = e.runs + 1
      e.leaseUntil = cjson.null
      e.receipt = fresh.receipt
      e.error = fresh.error
    end
  end
  if e then
    e.updatedAt = now
    redis.call('HSET', key, ARGV[at], cjson.encode(e))
  end
end
return {1}
`;

/** The scripts by name. @internal */
export const SNAPSHOT_SCRIPTS = { create: CREATE, commit: COMMIT } as const;
