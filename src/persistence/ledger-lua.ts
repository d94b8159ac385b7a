/**
 * The ledger's Lua scripts. Each is one atomic check-and-write on the HASH of one run and tenant
 * (field = call id, value = the entry as JSON). User data (args, receipt, error) is stored as JSON
 * text inside the entry, so cjson only ever decodes and re-encodes the runtime's own fields and
 * never reorders, rounds or turns `[]` into `{}` in what a tool returned.
 *
 * Every script returns `{status, entry json or '', now}`; `now` is the time it used, in ms.
 * @internal
 */

/** Bump when a script changes meaning, so clients never mix versions under one command name. */
export const LEDGER_SCRIPT_VERSION = 3;

const PRELUDE = `
local function now_ms(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function is_null(v) return v == nil or v == cjson.null end
local function expired(e, now)
  return e.state == 'RUNNING' and not is_null(e.leaseUntil) and tonumber(e.leaseUntil) < now
end
local function reply(status, raw, now) return {status, raw or '', string.format('%d', now)} end
-- A new entry (decoded from the caller's JSON) gets its place in the run's order and its birth.
local function fresh_entry(json, now)
  local e = cjson.decode(json)
  e.seq = redis.call('HLEN', KEYS[1]) + 1
  e.createdAt = now
  return e
end
local function save(e, now)
  e.updatedAt = now
  local raw = cjson.encode(e)
  redis.call('HSET', KEYS[1], ARGV[1], raw)
  return raw
end
-- Takes the lease of entry e (raw: as stored) for a new run, or says why not: what markRunning
-- and begin share.
local function take_lease(e, raw, lease_ms, rerun, now)
  if e.state == 'SUCCEEDED' then return reply('succeeded', raw, now) end
  if e.state == 'RUNNING' then
    if not expired(e, now) then return reply('busy', raw, now) end
    if not rerun then
      e.state = 'IN_DOUBT'
      e.leaseUntil = cjson.null
      return reply('in_doubt', save(e, now), now)
    end
  elseif e.state == 'IN_DOUBT' then
    if not rerun then return reply('in_doubt', raw, now) end
  elseif e.state == 'FAILED' then
    local ok, err = pcall(cjson.decode, e.error)
    if not (ok and type(err) == 'table' and err.retryable == true) then
      return reply('failed', raw, now)
    end
  end
  e.state = 'RUNNING'
  e.runs = e.runs + 1
  e.leaseUntil = now + tonumber(lease_ms)
  e.error = cjson.null
  return reply('running', save(e, now), now)
end
`;

/*
 * prepare: creates a PREPARED entry, or returns the existing one.
 *   KEYS[1]  the ledger hash of the run and tenant
 *   ARGV[1]  call id (the hash field)
 *   ARGV[2]  the new entry (JSON), stored only when the field is absent
 *   ARGV[3]  tool identity       ARGV[4] args hash      ARGV[5] now in ms, '' = Redis clock
 *   Returns  'created' | 'existing' | 'mismatch' (other tool or args; unchanged) |
 *            'in_doubt' (it was RUNNING with an expired lease and is now IN_DOUBT)
 */
const PREPARE = `
local now = now_ms(ARGV[5])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return reply('created', save(fresh_entry(ARGV[2], now), now), now) end
local e = cjson.decode(raw)
if e.tool ~= ARGV[3] or e.argsHash ~= ARGV[4] then return reply('mismatch', raw, now) end
if expired(e, now) then
  e.state = 'IN_DOUBT'
  e.leaseUntil = cjson.null
  return reply('in_doubt', save(e, now), now)
end
return reply('existing', raw, now)
`;

/*
 * markRunning: takes the call's lease for a new run of the tool.
 *   KEYS[1]  the ledger hash        ARGV[1] call id     ARGV[2] lease ms
 *   ARGV[3]  '1' when an in-doubt call may be re-run (idempotent tool), else '0'
 *   ARGV[4]  now in ms, '' = Redis clock
 *   Returns  'running' (PREPARED, retryable FAILED or permitted IN_DOUBT → RUNNING, runs + 1) |
 *            'succeeded' | 'failed' (final error) | 'busy' (live lease) |
 *            'in_doubt' (not permitted; an expired RUNNING entry becomes IN_DOUBT) | 'missing'
 */
const MARK_RUNNING = `
local now = now_ms(ARGV[4])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return reply('missing', nil, now) end
return take_lease(cjson.decode(raw), raw, ARGV[2], ARGV[3] == '1', now)
`;

/*
 * begin: prepare and markRunning in one step, for a call with nothing to check in between (no
 * budget to count it against): creates the entry or checks it is the same call, then takes the
 * lease exactly as markRunning does.
 *   KEYS[1]  the ledger hash        ARGV[1] call id
 *   ARGV[2]  the new entry (JSON), stored only when the field is absent
 *   ARGV[3]  tool identity          ARGV[4] args hash      ARGV[5] lease ms
 *   ARGV[6]  '1' when an in-doubt call may be re-run, else '0'      ARGV[7] now in ms, '' = Redis clock
 *   Returns  'mismatch' (another tool or other args; unchanged) | what markRunning returns
 */
const BEGIN = `
local now = now_ms(ARGV[7])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local e
if raw then
  e = cjson.decode(raw)
  if e.tool ~= ARGV[3] or e.argsHash ~= ARGV[4] then return reply('mismatch', raw, now) end
else
  e = fresh_entry(ARGV[2], now)
end
return take_lease(e, raw, ARGV[5], ARGV[6] == '1', now)
`;

/*
 * record: the outcome of a read-only call, which ran without a lease (it has no effect a second
 * run could repeat). Creates the entry with the outcome (runs 1). An entry that already has a
 * receipt (an earlier run of the same call) is kept and returned, so every run of the call reads
 * one receipt; an entry in any other state takes the outcome (runs + 1).
 *   KEYS[1]  the ledger hash        ARGV[1] call id
 *   ARGV[2]  the new entry (JSON): state SUCCEEDED with its receipt, or FAILED with its error
 *   ARGV[3]  tool identity          ARGV[4] args hash      ARGV[5] now in ms, '' = Redis clock
 *   Returns  'recorded' | 'succeeded' (a receipt was there; unchanged) |
 *            'mismatch' (another tool or other args; unchanged)
 */
const RECORD = `
local now = now_ms(ARGV[5])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return reply('recorded', save(fresh_entry(ARGV[2], now), now), now) end
local fresh = cjson.decode(ARGV[2])
local e = cjson.decode(raw)
if e.tool ~= ARGV[3] or e.argsHash ~= ARGV[4] then return reply('mismatch', raw, now) end
if e.state == 'SUCCEEDED' then return reply('succeeded', raw, now) end
e.state = fresh.state
e.runs = e.runs + 1
e.leaseUntil = cjson.null
e.receipt = fresh.receipt
e.error = fresh.error
return reply('recorded', save(e, now), now)
`;

/*
 * renewLease: extends the lease of the caller's own run of the tool.
 *   KEYS[1]  the ledger hash   ARGV[1] call id   ARGV[2] lease ms   ARGV[3] the caller's run number
 *   ARGV[4]  now in ms, '' = Redis clock
 *   Returns  'applied' (still RUNNING with that run number) | 'stale' (unchanged) | 'missing'
 */
const RENEW = `
local now = now_ms(ARGV[4])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return reply('missing', nil, now) end
local e = cjson.decode(raw)
if e.state ~= 'RUNNING' or e.runs ~= tonumber(ARGV[3]) then return reply('stale', raw, now) end
e.leaseUntil = now + tonumber(ARGV[2])
return reply('applied', save(e, now), now)
`;

/*
 * finish: records the outcome of the caller's run of the tool.
 *   KEYS[1]  the ledger hash   ARGV[1] call id   ARGV[2] 'SUCCEEDED' | 'FAILED'
 *   ARGV[3]  receipt or error as JSON text      ARGV[4] the caller's run number
 *   ARGV[5]  now in ms, '' = Redis clock
 *   Returns  'applied' (it was RUNNING, or IN_DOUBT, with that run number: the outcome is the truth
 *            even if the lease lapsed, as long as nobody ran the tool since) | 'stale' | 'missing'
 */
const FINISH = `
local now = now_ms(ARGV[5])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return reply('missing', nil, now) end
local e = cjson.decode(raw)
if (e.state ~= 'RUNNING' and e.state ~= 'IN_DOUBT') or e.runs ~= tonumber(ARGV[4]) then
  return reply('stale', raw, now)
end
e.state = ARGV[2]
e.leaseUntil = cjson.null
if ARGV[2] == 'SUCCEEDED' then
  e.receipt = ARGV[3]
  e.error = cjson.null
else
  e.error = ARGV[3]
end
return reply('applied', save(e, now), now)
`;

/*
 * resolve: a person's verdict on a call in doubt.
 *   KEYS[1]  the ledger hash   ARGV[1] call id   ARGV[2] 'succeeded' | 'retry'
 *   ARGV[3]  receipt JSON text (for 'succeeded')   ARGV[4] who resolved it
 *   ARGV[5]  now in ms, '' = Redis clock
 *   Returns  'applied' (IN_DOUBT or expired RUNNING → SUCCEEDED or PREPARED, resolution recorded) |
 *            'refused' (any other state; unchanged) | 'missing'
 */
const RESOLVE = `
local now = now_ms(ARGV[5])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return reply('missing', nil, now) end
local e = cjson.decode(raw)
if e.state ~= 'IN_DOUBT' and not expired(e, now) then return reply('refused', raw, now) end
if ARGV[2] == 'succeeded' then
  e.state = 'SUCCEEDED'
  e.receipt = ARGV[3]
  e.error = cjson.null
else
  e.state = 'PREPARED'
end
e.leaseUntil = cjson.null
e.resolution = { by = ARGV[4], at = now, as = ARGV[2] }
return reply('applied', save(e, now), now)
`;

/** The scripts by command name (without the version suffix), each with its number of keys. */
export const LEDGER_SCRIPTS = {
  prepare: PRELUDE + PREPARE,
  markRunning: PRELUDE + MARK_RUNNING,
  begin: PRELUDE + BEGIN,
  record: PRELUDE + RECORD,
  renewLease: PRELUDE + RENEW,
  finish: PRELUDE + FINISH,
  resolve: PRELUDE + RESOLVE,
} as const;
