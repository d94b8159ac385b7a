/**
 * Retention of finished runs: every key a run wrote gets an expiry when the run finishes, and a
 * small tombstone outlives them, so that asking for a removed run says so instead of "not found".
 * A failed run is not finished for good (it may be resumed): it keeps its keys, with no expiry,
 * unless `failedRunsMs` is set; it gets the expiry of finished runs once it is resumed and ends.
 *
 * The keys of a run are listed here, from what the run was started with (its steps, its tenant,
 * its request key) and what it stored (its blobs): other stores that add keys of a run register a
 * {@link RunKeySource}. The run's own keys share its hash tag and get their expiry in one script
 * ({@link RetentionStore.expireRun}), with the tombstone, and only if the snapshot still says the
 * run finished (a run resumed meanwhile keeps its keys). A run without a tombstone thus is "not
 * done yet". The end of a run as a whole (these keys, those of other slots, the reservation
 * records, the active runs, the run list) is `run-end.ts`'s, in two round trips.
 *
 * The tenant's reservation records (one HASH for all its runs) cannot expire field by field: a
 * finished run's record ids are queued with the time its keys expire, and each later end in the
 * tenant removes the records that are due.
 */
import type { Redis } from 'ioredis';
import { pipelineByKey } from './connection.js';
import { InputValidationError, type ValidationIssue } from '../errors.js';
import type { Keys } from './keys.js';
import { classifyRedisError } from './redis-errors.js';

/** How long finished runs are kept by default: 7 days. */
export const DEFAULT_FINISHED_RUNS_MS = 7 * 24 * 60 * 60 * 1000;

/** How much longer than the run its tombstone is kept by default: 30 days. */
export const TOMBSTONE_EXTRA_MS = 30 * 24 * 60 * 60 * 1000;

/** Options of retention (`createRuntime({ retention })`). */
export interface RetentionOptions {
  /**
   * How long every key of a run is kept after the run finished (succeeded or cancelled), in ms.
   * Runs that wait or still work keep everything. @defaultValue 7 days
   */
  finishedRunsMs?: number;
  /**
   * How long every key of a failed run is kept after it failed, in ms. Left out, a failed run keeps
   * everything until it is resumed and finishes (then `finishedRunsMs` applies). @defaultValue
   * none: failed runs are kept
   */
  failedRunsMs?: number;
  /**
   * How long a removed run's tombstone outlives its keys, in ms: while it is there, asking for the
   * run says it was removed (`RunRemovedError`) rather than unknown (`RunNotFoundError`).
   * @defaultValue 30 days
   */
  tombstoneMs?: number;
}

/** What a run was started with, as far as its keys go. */
export interface RunKeyInfo {
  tenantId: string;
  /** The ids of the plan's steps (one history list each, at most). */
  stepIds: readonly string[];
  /** The request key the run was started with, if any. */
  requestKey: string | null;
  /** The ids of the plan's map steps (their items' keys). */
  mapStepIds?: readonly string[];
}

/** The keys of a run that a store adds, by Redis Cluster slot. */
export interface RunKeys {
  /** Keys in the run's hash tag. */
  run: string[];
  /** Keys in the tenant's hash tag. */
  tenant: string[];
  /** Keys of other slots (one command each). */
  other: string[];
}

/** Lists keys of a run that a store outside this module writes. */
export type RunKeySource = (runId: string, info: RunKeyInfo) => Partial<RunKeys>;

/** The tombstone of a removed run. */
export interface RemovedRun {
  /** When the run was given its expiry (it had finished or failed), epoch ms. */
  finishedAt: number;
  /** How long it was kept after that, in ms. */
  retentionMs: number;
  /** Whether it had failed (kept `failedRunsMs`), not finished (kept `finishedRunsMs`). */
  failed: boolean;
}

/** Gives finished runs their expiry and tells removed runs from unknown ones. */
export interface RetentionStore {
  /** The retention of finished runs, in ms. */
  readonly finishedRunsMs: number;
  /** The retention of failed runs, in ms; null: failed runs are kept. */
  readonly failedRunsMs: number | null;
  /** Every key the run may have, by slot (keys that do not exist are harmless). */
  runKeys(runId: string, info: RunKeyInfo): Promise<RunKeys>;
  /** The keys of {@link runKeys}, given the run's blob keys (as {@link blobKeys} reads them). */
  keysWith(runId: string, info: RunKeyInfo, blobKeys: readonly string[]): RunKeys;
  /** The keys of the run's blobs, from its blob accounting (one read). */
  blobKeys(runId: string): Promise<string[]>;
  /**
   * Gives the run's own keys (`run`, as {@link keysWith} lists them, the snapshot last) their
   * expiry and writes its tombstone, in one script, if the snapshot says the run ended as `failed`
   * says (`finishedRunsMs` for a run that succeeded or was cancelled, `failedRunsMs` for one that
   * failed) and that was not done already (a run that failed and was given its expiry, then
   * finished, gets that of finished runs). The keys of other slots are the caller's (see
   * `run-end.ts`). Returns 1 set now; 4 set now, in place of the expiry of the failed run it was;
   * 3 done already; 0 the run has not ended; 2 it ended otherwise; -1 no snapshot (nothing set
   * but for 1 and 4).
   */
  expireRun(runId: string, run: readonly string[], failed: boolean, ms: number): Promise<number>;
  /** Removes the expiry of every key of a run that goes on again (a resumed run) and its tombstone. */
  keep(runId: string, info: RunKeyInfo): Promise<void>;
  /** The tombstone of a run removed by retention, or null. */
  removed(runId: string): Promise<RemovedRun | null>;
  /** Adds a source of run keys (another store's). */
  addKeySource(source: RunKeySource): void;
}

/** Options of {@link createRetentionStore}. */
export interface RetentionStoreOptions {
  redis: Redis;
  keys: Keys;
  /** @defaultValue {@link DEFAULT_FINISHED_RUNS_MS} */
  finishedRunsMs?: number;
  /** @defaultValue null: failed runs are kept */
  failedRunsMs?: number | null;
  /** @defaultValue {@link TOMBSTONE_EXTRA_MS} */
  tombstoneMs?: number;
  /**
   * The expiry blobs have while their run goes on (set back on `keep`); null: none (they go with
   * the run). @defaultValue null
   */
  blobRetentionMs?: number | null;
  /** @defaultValue `Date.now` */
  clock?: () => number;
}

/**
 * The retention options, checked: throws {@link InputValidationError} naming each bad field unless
 * `finishedRunsMs` and `failedRunsMs` are each absent or a positive finite number of milliseconds.
 * An absent `failedRunsMs` is null: failed runs are kept.
 */
export function parseRetentionOptions(value: unknown): {
  finishedRunsMs: number;
  failedRunsMs: number | null;
  tombstoneMs: number;
} {
  if (value === undefined) {
    return {
      finishedRunsMs: DEFAULT_FINISHED_RUNS_MS,
      failedRunsMs: null,
      tombstoneMs: TOMBSTONE_EXTRA_MS,
    };
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new InputValidationError('runtime options', [
      {
        path: 'retention',
        message: 'must be an object, e.g. retention: { finishedRunsMs: 7 * 24 * 3600 * 1000 }',
      },
    ]);
  }
  const issues: ValidationIssue[] = [];
  const got = (ms: unknown) =>
    typeof ms === 'number' ? String(ms) : ms === null ? 'null' : typeof ms;
  const check = (
    field: 'finishedRunsMs' | 'failedRunsMs' | 'tombstoneMs',
    example: string,
  ): number | null => {
    const ms: unknown = (value as Record<string, unknown>)[field];
    if (ms === undefined) return null;
    if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 1) {
      issues.push({
        path: `retention.${field}`,
        message: `must be a number of milliseconds ≥ 1, e.g. ${example}; got ${got(ms)}`,
      });
      return null;
    }
    return Math.ceil(ms);
  };
  const finishedRunsMs = check('finishedRunsMs', '7 * 24 * 3600 * 1000 for 7 days');
  const failedRunsMs = check(
    'failedRunsMs',
    '30 * 24 * 3600 * 1000 for 30 days (or left out: failed runs are kept until resumed)',
  );
  const tombstoneMs = check('tombstoneMs', '30 * 24 * 3600 * 1000 for 30 days');
  if (issues.length > 0) throw new InputValidationError('runtime options', issues);
  return {
    finishedRunsMs: finishedRunsMs ?? DEFAULT_FINISHED_RUNS_MS,
    failedRunsMs,
    tombstoneMs: tombstoneMs ?? TOMBSTONE_EXTRA_MS,
  };
}

const BLOB_ACCOUNTING_FIELDS = new Set(['bytes', 'count']);

/** A member of the tenant's queue of expiring reservation records, or null when it is not one. */
function queuedRun(member: string): { runId: string; ids: string[] } | null {
  try {
    const parsed = JSON.parse(member) as { runId?: unknown; ids?: unknown };
    if (typeof parsed.runId !== 'string' || !Array.isArray(parsed.ids)) return null;
    return { runId: parsed.runId, ids: parsed.ids.filter((id) => typeof id === 'string') };
  } catch {
    return null;
  }
}

/** A tombstone as stored (one written before failed runs were told apart is a finished run's). */
function tombstoneOf(raw: string): RemovedRun {
  try {
    const parsed = JSON.parse(raw) as Partial<RemovedRun>;
    return {
      finishedAt: Number(parsed.finishedAt ?? 0),
      retentionMs: Number(parsed.retentionMs ?? 0),
      failed: parsed.failed === true,
    };
  } catch {
    return { finishedAt: 0, retentionMs: 0, failed: false };
  }
}

/*
 * expire: gives an ended run's keys their expiry and writes its tombstone, if the run is still in
 * the state the expiry is for and that was not done already.
 *   KEYS[1]  the tombstone   KEYS[2]  the snapshot (HASH)   KEYS[3..]  the run's other keys
 *   ARGV[1]  the expiry, ms   ARGV[2] the tombstone's expiry, ms   ARGV[3] the tombstone
 *   ARGV[4]  'failed': for a failed run; 'finished': for one that succeeded or was cancelled
 *   Reads    HGET snap run (the run's derived status, `rs`); GET tombstone
 *   Returns  1 set; 0 the run has not ended (nothing set); 2 it ended otherwise (nothing set);
 *            -1 no snapshot (nothing set); 3 done already: a tombstone is there, and it is not a
 *            failed run's while the run has finished since (nothing set); 4 set, in place of a
 *            failed run's expiry
 */
const EXPIRE = `
local part = redis.call('HGET', KEYS[2], 'run')
if not part then return -1 end
local ok, run = pcall(cjson.decode, part)
if not ok or type(run) ~= 'table' then return 0 end
local rs = run['rs']
local failed = rs == 'failed'
if not failed and rs ~= 'succeeded' and rs ~= 'cancelled' then return 0 end
if failed ~= (ARGV[4] == 'failed') then return 2 end
local prior = redis.call('GET', KEYS[1])
if prior then
  local read, stone = pcall(cjson.decode, prior)
  if failed or not (read and type(stone) == 'table' and stone['failed'] == true) then return 3 end
end
for i = 2, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
if prior then return 4 end
return 1
`;
const EXPIRE_COMMAND = 'flujoRetention_expire_v3';
type Expire = (...args: string[]) => Promise<number>;

/** Creates a Redis-backed {@link RetentionStore}. */
export function createRetentionStore(options: RetentionStoreOptions): RetentionStore {
  const { redis, keys } = options;
  const finishedRunsMs = options.finishedRunsMs ?? DEFAULT_FINISHED_RUNS_MS;
  const failedRunsMs = options.failedRunsMs ?? null;
  const tombstoneMs = options.tombstoneMs ?? TOMBSTONE_EXTRA_MS;
  const blobRetentionMs = options.blobRetentionMs ?? null;
  const clock = options.clock ?? Date.now;
  const sources: RunKeySource[] = [];
  const commands = redis as unknown as Record<string, Expire | undefined>;
  if (commands[EXPIRE_COMMAND] === undefined) redis.defineCommand(EXPIRE_COMMAND, { lua: EXPIRE });
  const expire: Expire = (...args) => (commands[EXPIRE_COMMAND] as Expire).apply(redis, args);

  const fail = (error: unknown): never => {
    throw classifyRedisError(error, redis);
  };

  /** The run's blob keys, from its blob accounting. */
  async function blobKeys(runId: string): Promise<string[]> {
    const fields = await redis.hkeys(keys.blobs(runId));
    return fields.filter((f) => !BLOB_ACCOUNTING_FIELDS.has(f)).map((id) => keys.blob(runId, id));
  }

  function keysWith(runId: string, info: RunKeyInfo, blobs: readonly string[]): RunKeys {
    const run = [
      keys.events(runId),
      keys.status(runId),
      keys.outputs(runId),
      keys.ledger(runId),
      keys.ledger(runId, info.tenantId),
      keys.journal(runId),
      ...info.stepIds.map((stepId) => keys.history(runId, stepId)),
      ...(info.mapStepIds ?? []).flatMap((stepId) => [
        keys.map(runId, stepId),
        keys.mapInflight(runId, stepId),
      ]),
      keys.blobs(runId),
      ...blobs,
      keys.meta(runId),
      keys.counters(runId),
      keys.fingerprints(runId),
      keys.started(runId),
      keys.progress(runId),
      keys.replays(runId),
      keys.inbox(runId),
    ];
    const tenant = [
      keys.runUsage(info.tenantId, runId),
      keys.runReservations(info.tenantId, runId),
      keys.openReservations(info.tenantId, runId),
    ];
    const other = info.requestKey === null ? [] : [keys.requestKey(info.tenantId, info.requestKey)];
    for (const source of sources) {
      const more = source(runId, info);
      run.push(...(more.run ?? []));
      tenant.push(...(more.tenant ?? []));
      other.push(...(more.other ?? []));
    }
    run.push(keys.snap(runId));
    return { run, tenant, other };
  }

  async function runKeys(runId: string, info: RunKeyInfo): Promise<RunKeys> {
    return keysWith(runId, info, await blobKeys(runId));
  }

  return {
    finishedRunsMs,
    failedRunsMs,
    runKeys,

    keysWith,

    async blobKeys(runId) {
      try {
        return await blobKeys(runId);
      } catch (error) {
        return fail(error);
      }
    },

    async expireRun(runId, run, failed, ms) {
      const tombstone: RemovedRun = { finishedAt: clock(), retentionMs: ms, failed };
      const snap = keys.snap(runId);
      try {
        return await expire(
          String(1 + run.length),
          keys.removed(runId),
          snap,
          ...run.filter((k) => k !== snap),
          String(ms),
          String(ms + tombstoneMs),
          JSON.stringify(tombstone),
          failed ? 'failed' : 'finished',
        );
      } catch (error) {
        return fail(error);
      }
    },

    async keep(runId, info) {
      try {
        const queued = keys.expiringReservations(info.tenantId);
        const members = await redis.zrange(queued, '0', '-1');
        const mine = members.filter((m) => queuedRun(m)?.runId === runId);
        if (mine.length > 0) await redis.zrem(queued, ...mine);
        const { run, tenant, other } = await runKeys(runId, info);
        const blobs = new Set(await blobKeys(runId));
        blobs.add(keys.blobs(runId));
        await pipelineByKey(redis, [...tenant, ...other], (p, key) => p.persist(key));
        const tx = redis.multi();
        for (const key of run) {
          // Blobs keep the expiry they have while their run goes on.
          if (blobs.has(key) && blobRetentionMs !== null) tx.pexpire(key, String(blobRetentionMs));
          else tx.persist(key);
        }
        tx.del(keys.removed(runId));
        await tx.exec();
      } catch (error) {
        return fail(error);
      }
    },

    async removed(runId) {
      let raw: string | null;
      try {
        raw = await redis.get(keys.removed(runId));
      } catch (error) {
        return fail(error);
      }
      if (raw === null) return null;
      // The tombstone is there while the run still is (until its keys expire): not removed yet.
      try {
        if ((await redis.exists(keys.snap(runId))) === 1) return null;
      } catch (error) {
        return fail(error);
      }
      return tombstoneOf(raw);
    },

    addKeySource(source) {
      sources.push(source);
    },
  };
}
