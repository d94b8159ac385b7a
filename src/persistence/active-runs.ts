/**
 * The set of runs that are not finished: a run is added before it is created (or when it is
 * resumed or replayed) and removed once its keys got their expiry. A worker that starts walks it
 * to hand every unfinished run's due work to the queue again, and every worker walks it again
 * every `sweepEveryMs`.
 *
 * A run that ends also leaves a note among the runs that ended lately (a sorted set scored by the
 * end's time, kept for `endedWindowMs`), written by the same script that removes it from the active
 * runs. Both keys live in one Redis Cluster slot, and a run's own keys in another: a failover of
 * the run's slot to a replica that lagged can take back the run's last commits (its end included)
 * while its removal from the active runs stays. The sweep reads the snapshots of the runs that
 * ended lately and puts a run whose snapshot no longer says it ended back among the active runs.
 */
import type { Redis } from 'ioredis';
import { InputValidationError } from '../errors.js';
import type { ReplicaAck } from './replicas.js';
import type { Keys } from './keys.js';

/** How long a run that ended is checked by the sweeps by default, in ms: 15 minutes. */
export const DEFAULT_ENDED_RUNS_WINDOW_MS = 15 * 60 * 1000;

/** A run among those that ended lately. */
export interface EndedRun {
  runId: string;
  /** When it ended (its latest end), epoch ms. */
  endedAt: number;
}

/** What {@link ActiveRuns.reinstate} did. */
export type Reinstated =
  /** The run was put back among the active runs: nothing listed it. */
  | 'reinstated'
  /** The run was among the active runs already (resumed, or put back by another sweep). */
  | 'active'
  /** Nothing: its note changed meanwhile (it ended again, or a sweep dropped the note). */
  | 'changed';

/** Reads and writes the active runs of one prefix. */
export interface ActiveRuns {
  /** How long a run that ended is noted among the runs that ended lately, in ms (0: not at all). */
  readonly endedWindowMs: number;
  /** Notes a run as active (a no-op when it is). */
  add(runId: string): Promise<void>;
  /** Removes a run from the active runs (a no-op when it is not active), noting nothing else. */
  remove(runId: string): Promise<void>;
  /**
   * Notes a run as ended: removed from the active runs and noted among the runs that ended lately
   * at the current time, dropping the notes older than the window, in one script.
   */
  ended(runId: string): Promise<void>;
  /**
   * Calls `each` with every active run id, a page of at most `count` ids at a time, awaiting it
   * before the next page is read. A run added or removed meanwhile may be met or not.
   */
  forEach(each: (runId: string) => Promise<void>, count?: number): Promise<void>;
  /**
   * Drops the notes of runs that ended before the window, then calls `each` with every page (of
   * about `count`) of the runs that ended within it, awaiting it before the next page is read.
   */
  forEachEnded(each: (runs: EndedRun[]) => Promise<void>, count?: number): Promise<void>;
  /**
   * Puts a run that ended (as `run` says) back among the active runs, unless its note changed
   * meanwhile (it ended again since, which took it out again): one script. The note stays, for
   * {@link forget} once the run is driven again.
   */
  reinstate(run: EndedRun): Promise<Reinstated>;
  /** Drops the note of a run that ended, unless it changed meanwhile; whether it did. */
  forget(run: EndedRun): Promise<boolean>;
}

/** Options of {@link createActiveRuns}. */
export interface ActiveRunsOptions {
  /** @defaultValue {@link DEFAULT_ENDED_RUNS_WINDOW_MS} */
  endedWindowMs?: number;
  /** @defaultValue `Date.now` */
  clock?: () => number;
  /** Acknowledges an added run by replicas before `add` returns (see `replicas.ts`). @defaultValue none */
  replicas?: ReplicaAck | undefined;
}

/**
 * The window of the runs that ended lately, checked: 0 or a whole number of ms; absent is
 * {@link DEFAULT_ENDED_RUNS_WINDOW_MS}. `path` names the option in the error.
 */
export function checkEndedRunsWindow(value: unknown, path: string): number {
  if (value === undefined) return DEFAULT_ENDED_RUNS_WINDOW_MS;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0) {
    throw new InputValidationError('runtime options', [
      {
        path,
        message: `must be 0 (runs that ended are not checked again) or a whole number of ms, e.g. 15 * 60 * 1000; got ${typeof value === 'number' ? String(value) : typeof value}`,
      },
    ]);
  }
  return value;
}

/*
 * ended: the run leaves the active runs and is noted as ended now; notes older than the window go.
 *   KEYS[1] the active runs (SET)   KEYS[2] the runs that ended lately (ZSET)
 *   ARGV[1] the run   ARGV[2] now, epoch ms   ARGV[3] notes ending before this are dropped
 */
const ENDED = `
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[3])
return 1
`;

/*
 * settle: if the run's note still says it ended at ARGV[2], adds the run to the active runs
 * (ARGV[3] 'reinstate') or drops the note (ARGV[3] 'forget').
 *   KEYS[1] the active runs (SET)   KEYS[2] the runs that ended lately (ZSET)
 *   Returns -1 the note changed (nothing done); else SADD's reply (1 added, 0 was there), or 1
 */
const SETTLE = `
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return -1 end
if ARGV[3] == 'reinstate' then return redis.call('SADD', KEYS[1], ARGV[1]) end
return redis.call('ZREM', KEYS[2], ARGV[1])
`;

const ENDED_COMMAND = 'flujoActiveRuns_ended_v1';
const SETTLE_COMMAND = 'flujoActiveRuns_settle_v1';
type Script = (...args: string[]) => Promise<number>;

/** Creates the {@link ActiveRuns} of `keys`' prefix on `redis`. */
export function createActiveRuns(
  redis: Redis,
  keys: Keys,
  options: ActiveRunsOptions = {},
): ActiveRuns {
  const key = keys.activeRuns();
  const endedKey = keys.endedRuns();
  const endedWindowMs = options.endedWindowMs ?? DEFAULT_ENDED_RUNS_WINDOW_MS;
  const clock = options.clock ?? Date.now;
  const { replicas } = options;
  const commands = redis as unknown as Record<string, Script | undefined>;
  const script = (name: string, lua: string): Script => {
    if (commands[name] === undefined) redis.defineCommand(name, { numberOfKeys: 2, lua });
    return (...args) => (commands[name] as Script).apply(redis, args);
  };
  const endedScript = script(ENDED_COMMAND, ENDED);
  const settle = script(SETTLE_COMMAND, SETTLE);
  return {
    endedWindowMs,
    async add(runId) {
      await redis.sadd(key, runId);
      // Before the run's first job: a sweep finds the run even if that job is lost.
      if (replicas !== undefined) await replicas.ack(key);
    },
    async remove(runId) {
      await redis.srem(key, runId);
    },
    async ended(runId) {
      if (endedWindowMs === 0) {
        await redis.srem(key, runId);
        return;
      }
      const now = clock();
      await endedScript(key, endedKey, runId, String(now), String(now - endedWindowMs));
    },
    async forEach(each, count = 500) {
      let cursor = '0';
      do {
        const [next, ids] = await redis.sscan(key, cursor, 'COUNT', count);
        cursor = next;
        for (const runId of ids) await each(runId);
      } while (cursor !== '0');
    },
    async forEachEnded(each, count = 500) {
      if (endedWindowMs === 0) return;
      const since = clock() - endedWindowMs;
      await redis.zremrangebyscore(endedKey, '-inf', `(${since}`);
      let cursor = '0';
      do {
        const [next, flat] = await redis.zscan(endedKey, cursor, 'COUNT', count);
        cursor = next;
        const runs: EndedRun[] = [];
        for (let i = 0; i + 1 < flat.length; i += 2) {
          const endedAt = Number(flat[i + 1]);
          if (endedAt >= since) runs.push({ runId: flat[i] as string, endedAt });
        }
        if (runs.length > 0) await each(runs);
      } while (cursor !== '0');
    },
    async reinstate(run) {
      const added = await settle(key, endedKey, run.runId, String(run.endedAt), 'reinstate');
      return added === 1 ? 'reinstated' : added === 0 ? 'active' : 'changed';
    },
    async forget(run) {
      return (await settle(key, endedKey, run.runId, String(run.endedAt), 'forget')) === 1;
    },
  };
}
