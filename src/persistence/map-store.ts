/**
 * The items of map steps, kept beside the run rather than in its snapshot: per map step one HASH
 * (its attempt's counters, each item's element, output, attempt and error) and one SET (the items
 * dispatched and not committed), both in the run's hash tag (see `RunKeyKind.Map`). An item's
 * commit is one script on these two keys that does the same work whatever the map's size: it
 * records the output, counts it, and takes the next index to dispatch. It is idempotent: an item
 * already committed (or one of an attempt that is over) changes nothing and says so.
 */
import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';
import type { ReplicaAck } from './replicas.js';

/** The state of a map's item in flight: its index and attempt. */
export interface InflightItem {
  index: number;
  attempt: number;
}

/** What a map step's attempt has come to, for views and sweeps. */
export interface MapCounts {
  attempt: number;
  total: number;
  done: number;
  failed: number;
  /** Items in flight (dispatched, not committed). */
  running: number;
  /** `done` when every item is committed, `failed` when one failed the map; null while it runs. */
  end: 'done' | 'failed' | null;
}

/** What an item's start found: its element to run, or why it runs nothing. */
export type ItemBegin =
  | { kind: 'run'; element: string }
  /** `done`: committed already; `ended`: the map is finishing; `stale`: another attempt is current; `gone`: another map attempt. */
  | { kind: 'done' | 'ended' | 'stale' | 'gone' };

/** What an item's commit did. */
export type ItemCommitted =
  /** Recorded; `next` are the indexes it dispatched (to enqueue). */
  | { kind: 'ok'; next: number[] }
  /** The item's next attempt is numbered `attempt` (to enqueue after its backoff). */
  | { kind: 'retry'; attempt: number }
  /** Recorded, and the map is over (every item committed, or this one failed it): finish it. */
  | { kind: 'finish' }
  /** Nothing written (see {@link ItemBegin}). */
  | { kind: 'done' | 'ended' | 'stale' | 'gone' };

/** How an item's attempt ended, for its commit. */
export type ItemOutcome = 'ok' | 'retry' | 'failed';

/** What a finished map holds: its items' outputs in order, or the item that failed it. */
export type MapResults =
  | { kind: 'done'; outputs: string[] }
  | { kind: 'failed'; index: number; attempts: number; error: string }
  | { kind: 'none' };

/** The map steps' items of the runs of one prefix. */
export interface MapStore {
  /**
   * Starts attempt `attempt` of a map step over `elements` (JSON texts), dispatching the first
   * `maxConcurrency` items, unless it started already; returns the items in flight (to enqueue).
   * A state of another attempt is replaced, but for the outputs it committed over the same
   * elements: those items count as done and are never dispatched again (a resumed run runs only
   * the items that failed or never ran).
   */
  start(
    runId: string,
    stepId: string,
    attempt: number,
    args: { maxConcurrency: number; mode: 'fail' | 'collect'; elements: readonly string[] },
  ): Promise<InflightItem[]>;
  /** Whether attempt `itemAttempt` of item `index` is to run, and its element. */
  begin(
    runId: string,
    stepId: string,
    attempt: number,
    index: number,
    itemAttempt: number,
  ): Promise<ItemBegin>;
  /** Commits attempt `itemAttempt` of item `index`: its output (or error record) `payload`. */
  commit(
    runId: string,
    stepId: string,
    attempt: number,
    item: { index: number; itemAttempt: number; outcome: ItemOutcome; payload: string },
  ): Promise<ItemCommitted>;
  /** The items in flight of attempt `attempt` and how it ended (null: the state is another attempt's, or none). */
  pending(
    runId: string,
    stepId: string,
    attempt: number,
  ): Promise<{ end: 'done' | 'failed' | null; inflight: InflightItem[] } | null>;
  /** The counts of the map step's latest attempt (null: it never started). */
  counts(runId: string, stepId: string): Promise<MapCounts | null>;
  /** What a finished attempt holds (read once, by the unit that finishes the map). */
  results(runId: string, stepId: string, attempt: number): Promise<MapResults>;
}

// The items in flight, each with its attempt (1 when none is noted).
const INFLIGHT_LUA = `
local function inflight(h, set)
  local out = {}
  for _, m in ipairs(redis.call('SMEMBERS', set)) do
    out[#out + 1] = tonumber(m)
    out[#out + 1] = tonumber(redis.call('HGET', h, 'a:' .. m) or '1')
  end
  return out
end
`;

/**
 * KEYS[1] the map's hash, KEYS[2] its in-flight set.
 * ARGV[1] attempt, ARGV[2] maxConcurrency, ARGV[3] mode, ARGV[4..] the elements.
 * Returns the items in flight, flat: index, attempt, …
 */
const START_LUA = `${INFLIGHT_LUA}
local current = redis.call('HGET', KEYS[1], 'attempt')
if current == ARGV[1] then return inflight(KEYS[1], KEYS[2]) end
local n = #ARGV - 3
local kept = {}
if current then
  -- A new attempt of the step (its run resumed): an item an earlier attempt committed with an
  -- output (not an error record) over the same element at the same index keeps it, and never
  -- runs again.
  if tonumber(redis.call('HGET', KEYS[1], 'total') or '-1') == n then
    for i = 0, n - 1 do
      local o = redis.call('HGET', KEYS[1], 'o:' .. i)
      if o and redis.call('HEXISTS', KEYS[1], 'f:' .. i) == 0
        and redis.call('HGET', KEYS[1], 'i:' .. i) == ARGV[4 + i] then
        kept[i] = o
      end
    end
  end
  redis.call('DEL', KEYS[1], KEYS[2])
end
local done = 0
redis.call('HSET', KEYS[1], 'attempt', ARGV[1], 'total', n, 'failed', 0, 'mode', ARGV[3])
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], 'i:' .. i, ARGV[4 + i])
  if kept[i] then
    redis.call('HSET', KEYS[1], 'o:' .. i, kept[i])
    done = done + 1
  end
end
local nx, started, limit = 0, 0, tonumber(ARGV[2])
while nx < n and started < limit do
  if not kept[nx] then
    redis.call('SADD', KEYS[2], nx)
    started = started + 1
  end
  nx = nx + 1
end
redis.call('HSET', KEYS[1], 'next', nx, 'done', done)
if done >= n then redis.call('HSET', KEYS[1], 'end', 'done') end
return inflight(KEYS[1], KEYS[2])
`;

// Why an item of attempt ARGV[1], index ARGV[2], attempt ARGV[3] does not run (false: it runs).
const CHECK_LUA = `
local function refused(h)
  if redis.call('HGET', h, 'attempt') ~= ARGV[1] then return 'gone' end
  if redis.call('HEXISTS', h, 'o:' .. ARGV[2]) == 1 then return 'done' end
  if redis.call('HEXISTS', h, 'end') == 1 then return 'ended' end
  if (redis.call('HGET', h, 'a:' .. ARGV[2]) or '1') ~= ARGV[3] then return 'stale' end
  return false
end
`;

/** KEYS[1] the map's hash. ARGV[1] attempt, ARGV[2] index, ARGV[3] item attempt. */
const BEGIN_LUA = `${CHECK_LUA}
local why = refused(KEYS[1])
if why then return {why} end
return {'run', redis.call('HGET', KEYS[1], 'i:' .. ARGV[2]) or 'null'}
`;

/**
 * KEYS[1] the map's hash, KEYS[2] its in-flight set. ARGV[1] attempt, ARGV[2] index, ARGV[3] item
 * attempt, ARGV[4] outcome (ok, retry, failed), ARGV[5] payload (output, or error record).
 */
const COMMIT_LUA = `${CHECK_LUA}
local h, set, i = KEYS[1], KEYS[2], ARGV[2]
local why = refused(h)
if why then return {why} end
if ARGV[4] == 'retry' then
  local nextAttempt = tonumber(ARGV[3]) + 1
  redis.call('HSET', h, 'a:' .. i, nextAttempt)
  return {'retry', nextAttempt}
end
if ARGV[4] == 'failed' then
  redis.call('HINCRBY', h, 'failed', 1)
  if redis.call('HGET', h, 'mode') == 'fail' then
    redis.call('HSET', h, 'e:' .. i, ARGV[5], 'end', 'failed', 'failedAt', i)
    redis.call('SREM', set, i)
    return {'finish'}
  end
  -- Collected: its error record takes its place, marked so that a new attempt runs it again.
  redis.call('HSET', h, 'f:' .. i, 1)
end
-- The element stays: a new attempt of the step keeps this output only over the same element.
redis.call('HSET', h, 'o:' .. i, ARGV[5])
redis.call('SREM', set, i)
local done = redis.call('HINCRBY', h, 'done', 1)
local total = tonumber(redis.call('HGET', h, 'total'))
if done >= total then
  redis.call('HSET', h, 'end', 'done')
  return {'finish'}
end
local nx = tonumber(redis.call('HGET', h, 'next'))
-- Items an earlier attempt of the step committed are not dispatched again.
while nx < total and redis.call('HEXISTS', h, 'o:' .. nx) == 1 do nx = nx + 1 end
if nx < total then
  redis.call('SADD', set, nx)
  redis.call('HSET', h, 'next', nx + 1)
  return {'ok', nx}
end
redis.call('HSET', h, 'next', nx)
return {'ok'}
`;

/** KEYS[1] the map's hash, KEYS[2] its in-flight set. ARGV[1] attempt. */
const PENDING_LUA = `${INFLIGHT_LUA}
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return false end
return {redis.call('HGET', KEYS[1], 'end') or '', inflight(KEYS[1], KEYS[2])}
`;

const START_COMMAND = 'flujoMapStart_v2';
const BEGIN_COMMAND = 'flujoMapBegin_v1';
const COMMIT_COMMAND = 'flujoMapCommit_v2';
const PENDING_COMMAND = 'flujoMapPending_v1';

type Scripted = Redis & Record<string, (...args: (string | number)[]) => Promise<unknown>>;

function pairs(flat: unknown[]): InflightItem[] {
  const out: InflightItem[] = [];
  for (let i = 0; i + 1 < flat.length; i += 2) {
    out.push({ index: Number(flat[i]), attempt: Number(flat[i + 1]) });
  }
  return out.sort((a, b) => a.index - b.index);
}

/** The most fields one HMGET of the outputs reads. */
const READ_CHUNK = 1000;

/**
 * The map store on `redis` under `keys`. With `replicas` (the runtime's `durability`), a map's
 * start and each item's commit resolve once the replicas asked for have them, as a run's commits
 * do: what a worker acts on next (the items it dispatches, the finish) survives a failover.
 */
export function createMapStore(redis: Redis, keys: Keys, replicas?: ReplicaAck): MapStore {
  const commands: [string, number, string][] = [
    [START_COMMAND, 2, START_LUA],
    [BEGIN_COMMAND, 1, BEGIN_LUA],
    [COMMIT_COMMAND, 2, COMMIT_LUA],
    [PENDING_COMMAND, 2, PENDING_LUA],
  ];
  for (const [name, numberOfKeys, lua] of commands) {
    if (!(name in redis)) redis.defineCommand(name, { numberOfKeys, lua });
  }
  const r = redis as Scripted;
  const both = (runId: string, stepId: string) =>
    [keys.map(runId, stepId), keys.mapInflight(runId, stepId)] as const;

  return {
    async start(runId, stepId, attempt, args) {
      const flat = (await r[START_COMMAND]!(
        ...both(runId, stepId),
        attempt,
        args.maxConcurrency,
        args.mode,
        ...args.elements,
      )) as unknown[];
      if (replicas !== undefined) await replicas.ack(keys.map(runId, stepId));
      return pairs(flat);
    },

    async begin(runId, stepId, attempt, index, itemAttempt) {
      const [kind, element] = (await r[BEGIN_COMMAND]!(
        keys.map(runId, stepId),
        attempt,
        index,
        itemAttempt,
      )) as [string, string | undefined];
      if (kind === 'run') return { kind, element: element ?? 'null' };
      return { kind: kind as 'done' | 'ended' | 'stale' | 'gone' };
    },

    async commit(runId, stepId, attempt, item) {
      const reply = (await r[COMMIT_COMMAND]!(
        ...both(runId, stepId),
        attempt,
        item.index,
        item.itemAttempt,
        item.outcome,
        item.payload,
      )) as [string, ...unknown[]];
      const [kind, ...rest] = reply;
      if (
        replicas !== undefined &&
        kind !== 'done' &&
        kind !== 'ended' &&
        kind !== 'stale' &&
        kind !== 'gone'
      ) {
        await replicas.ack(keys.map(runId, stepId));
      }
      if (kind === 'ok') return { kind, next: rest.map(Number) };
      if (kind === 'retry') return { kind, attempt: Number(rest[0]) };
      if (kind === 'finish') return { kind };
      return { kind: kind as 'done' | 'ended' | 'stale' | 'gone' };
    },

    async pending(runId, stepId, attempt) {
      const reply = (await r[PENDING_COMMAND]!(...both(runId, stepId), attempt)) as
        [string, unknown[]] | null;
      if (reply === null) return null;
      const end = reply[0] === 'done' || reply[0] === 'failed' ? reply[0] : null;
      return { end, inflight: pairs(reply[1]) };
    },

    async counts(runId, stepId) {
      const [h, set] = both(runId, stepId);
      const [fields, running] = await Promise.all([
        redis.hmget(h, 'attempt', 'total', 'done', 'failed', 'end'),
        redis.scard(set),
      ]);
      const [attempt, total, done, failed, end] = fields;
      if (attempt === null || attempt === undefined) return null;
      return {
        attempt: Number(attempt),
        total: Number(total ?? 0),
        done: Number(done ?? 0),
        failed: Number(failed ?? 0),
        running,
        end: end === 'done' || end === 'failed' ? end : null,
      };
    },

    async results(runId, stepId, attempt) {
      const h = keys.map(runId, stepId);
      const [current, total, end, failedAt] = await redis.hmget(
        h,
        'attempt',
        'total',
        'end',
        'failedAt',
      );
      if (current !== String(attempt) || end === null) return { kind: 'none' };
      if (end === 'failed') {
        const index = Number(failedAt);
        const [error, attempts] = await redis.hmget(h, `e:${index}`, `a:${index}`);
        return { kind: 'failed', index, attempts: Number(attempts ?? 1), error: error ?? '{}' };
      }
      const n = Number(total ?? 0);
      const outputs: string[] = [];
      for (let from = 0; from < n; from += READ_CHUNK) {
        const fields: string[] = [];
        for (let i = from; i < Math.min(n, from + READ_CHUNK); i++) fields.push(`o:${i}`);
        const chunk = await redis.hmget(h, ...fields);
        for (const value of chunk) outputs.push(value ?? 'null');
      }
      return { kind: 'done', outputs };
    },
  };
}
