/**
 * The quota store's Lua scripts. Every key they touch is in the tenant's hash tag, so one script
 * checks the run's and the tenant's limits and writes both atomically, also on Redis Cluster.
 * Counters are integers (tokens, micro-USD) changed with HINCRBY; a reservation record is JSON
 * built by the client, with only the runtime's own fields (no user data) changed here.
 *
 * Every script returns `{status, record json or ''}`; `reserve` adds the numbers of a denial.
 * @internal
 */

/** Bump when a script changes meaning, so clients never mix versions under one command name. */
export const QUOTA_SCRIPT_VERSION = 3;

const PRELUDE = `
local function now_ms(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(n) return string.format('%d', n) end
local function counter(key, field) return tonumber(redis.call('HGET', key, field) or '0') end
local function limit_of(key, field) return tonumber(redis.call('HGET', key, field) or '') end
local function arg_limit(v) if v == '' then return nil end return tonumber(v) end
`;

/*
 * reserve: records a reservation and adds it to the reserved counters of the run, of its step (in
 * the run's usage, fields `step:<stepId>:reservedTokens` …) and of the tenant, unless the id exists
 * (returned unchanged) or a limit would be exceeded (nothing written).
 *   KEYS[1]  the tenant's reservations (HASH id → record)
 *   KEYS[2]  the run's reservation ids (LIST, creation order)
 *   KEYS[3]  the run's usage (HASH)        KEYS[4] the tenant's quota (HASH)
 *   KEYS[5]  the run's open reservation ids (SET)
 *   ARGV[1]  reservation id                ARGV[2] the new record (JSON; seq, createdAt set here)
 *   ARGV[3]  tokens requested              ARGV[4] micro-USD requested
 *   ARGV[5]  the run's maxTokens or ''     ARGV[6] the run's maxMicroUsd or ''
 *   ARGV[7]  now in ms, '' = Redis clock
 *   ARGV[8]  the step's maxTokens or ''    ARGV[9] the step's maxMicroUsd or ''
 *   Returns  {'created', record, others} (others: how many other reservations of the run are
 *            open) | {'existing', record} |
 *            {'denied', '', scope, limit, limitValue, spent, reserved, requested} (the step's
 *            limits are checked first, then the run's, then the tenant's, tokens before cost; the
 *            first exceeded one is named)
 */
const RESERVE = `
local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then return {'existing', existing} end
local e = cjson.decode(ARGV[2])
local sp = 'step:' .. e.stepId .. ':'
local checks = {
  {'step', KEYS[3], 'maxTokens', arg_limit(ARGV[8]), sp, 'Tokens', ARGV[3]},
  {'step', KEYS[3], 'maxCostUsd', arg_limit(ARGV[9]), sp, 'MicroUsd', ARGV[4]},
  {'run', KEYS[3], 'maxTokens', arg_limit(ARGV[5]), '', 'Tokens', ARGV[3]},
  {'run', KEYS[3], 'maxCostUsd', arg_limit(ARGV[6]), '', 'MicroUsd', ARGV[4]},
  {'tenant', KEYS[4], 'maxTokens', limit_of(KEYS[4], 'maxTokens'), '', 'Tokens', ARGV[3]},
  {'tenant', KEYS[4], 'maxCostUsd', limit_of(KEYS[4], 'maxMicroUsd'), '', 'MicroUsd', ARGV[4]},
}
for _, c in ipairs(checks) do
  local limit = c[4]
  if limit ~= nil then
    local spent = counter(c[2], c[5] .. 'spent' .. c[6])
    local reserved = counter(c[2], c[5] .. 'reserved' .. c[6])
    local requested = tonumber(c[7])
    if spent + reserved + requested > limit then
      return {'denied', '', c[1], c[3], int(limit), int(spent), int(reserved), int(requested)}
    end
  end
end
e.seq = redis.call('RPUSH', KEYS[2], ARGV[1])
e.createdAt = now_ms(ARGV[7])
local raw = cjson.encode(e)
redis.call('HSET', KEYS[1], ARGV[1], raw)
local others = redis.call('SCARD', KEYS[5])
redis.call('SADD', KEYS[5], ARGV[1])
for _, key in ipairs({KEYS[3], KEYS[4]}) do
  redis.call('HINCRBY', key, 'reservedTokens', ARGV[3])
  redis.call('HINCRBY', key, 'reservedMicroUsd', ARGV[4])
end
redis.call('HINCRBY', KEYS[3], sp .. 'reservedTokens', ARGV[3])
redis.call('HINCRBY', KEYS[3], sp .. 'reservedMicroUsd', ARGV[4])
-- The run's limits as its latest reservation gave them, for usage().
for i, field in ipairs({'maxTokens', 'maxMicroUsd'}) do
  if ARGV[4 + i] == '' then
    redis.call('HDEL', KEYS[3], field)
  else
    redis.call('HSET', KEYS[3], field, ARGV[4 + i])
  end
end
return {'created', raw, int(others)}
`;

/*
 * markSent: records that the request of a reservation went out.
 *   KEYS[1]  the tenant's reservations     ARGV[1] reservation id
 *   ARGV[2]  now in ms, '' = Redis clock
 *   Returns  {'applied', record} (reserved → sent, sentAt set) |
 *            {'unchanged', record} (already sent or reconciled) | {'missing', ''}
 */
const MARK_SENT = `
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return {'missing', ''} end
local e = cjson.decode(raw)
if e.state ~= 'reserved' then return {'unchanged', raw} end
e.state = 'sent'
e.sentAt = now_ms(ARGV[2])
raw = cjson.encode(e)
redis.call('HSET', KEYS[1], ARGV[1], raw)
return {'applied', raw}
`;

/*
 * reconcile: settles a reservation, exactly once. Releases exactly its reserved amounts from the
 * reserved counters of the run, of its step and of the tenant, and adds the charge to their spent
 * counters.
 *   KEYS[1]  the tenant's reservations     KEYS[2] the run's usage   KEYS[3] the tenant's quota
 *   KEYS[4]  the run's open reservation ids (SET)
 *   ARGV[1]  reservation id                ARGV[2] the run id KEYS[2] was built for
 *   ARGV[3]  'usage' | 'baseline' | 'none'
 *   ARGV[4]  input tokens   ARGV[5] output tokens   ARGV[6] micro-USD   (for 'usage', else '0')
 *   ARGV[7]  now in ms, '' = Redis clock
 *   Charge   usage: the figures given; baseline: the estimate's inputTokens and baselineMicroUsd;
 *            none: 0, unless the reservation was marked sent: then the baseline (recorded as
 *            outcome 'baseline', requestedOutcome 'none')
 *   Returns  {'applied', record} | {'already', record} (reconciled before; unchanged) |
 *            {'wrong_run', record} (unchanged) | {'missing', ''}
 */
const RECONCILE = `
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return {'missing', ''} end
local e = cjson.decode(raw)
if e.state == 'reconciled' then return {'already', raw} end
if e.runId ~= ARGV[2] then return {'wrong_run', raw} end
local kind = ARGV[3]
if kind == 'none' and e.state == 'sent' then kind = 'baseline' end
local input, output, micro = 0, 0, 0
if kind == 'usage' then
  input, output, micro = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
elseif kind == 'baseline' then
  input, micro = e.estimate.inputTokens, e.estimate.baselineMicroUsd
end
e.state = 'reconciled'
e.outcome = kind
e.requestedOutcome = ARGV[3]
e.charged = {inputTokens = input, outputTokens = output, tokens = input + output, microUsd = micro}
e.reconciledAt = now_ms(ARGV[7])
raw = cjson.encode(e)
redis.call('HSET', KEYS[1], ARGV[1], raw)
redis.call('SREM', KEYS[4], ARGV[1])
local sp = 'step:' .. e.stepId .. ':'
for _, c in ipairs({{KEYS[2], ''}, {KEYS[3], ''}, {KEYS[2], sp}}) do
  local key, p = c[1], c[2]
  redis.call('HINCRBY', key, p .. 'reservedTokens', int(-e.reservedTokens))
  redis.call('HINCRBY', key, p .. 'reservedMicroUsd', int(-e.reservedMicroUsd))
  redis.call('HINCRBY', key, p .. 'spentTokens', int(input + output))
  redis.call('HINCRBY', key, p .. 'spentMicroUsd', int(micro))
end
return {'applied', raw}
`;

/** The scripts by command name (without the version suffix), with their number of keys. */
export const QUOTA_SCRIPTS = {
  reserve: { keys: 5, lua: PRELUDE + RESERVE },
  markSent: { keys: 1, lua: PRELUDE + MARK_SENT },
  reconcile: { keys: 4, lua: PRELUDE + RECONCILE },
} as const;
