/**
 * The end of a run, in two round trips: its keys get their expiry (`retention.ts`), its
 * reservation records are queued for removal, it leaves the active runs and is noted among the
 * runs that ended lately (`active-runs.ts`), its end is noted in the run list (`run-index.ts`), and
 * the reservations it left open are read for whoever settles them. Each round trip sends one
 * command or script per slot, all at once (on a Redis Cluster, ioredis sends each to its node);
 * no script touches two slots.
 *
 * 1. The keys outside the run's slot get their expiry, unless they have one: the tenant's (in one
 *    script with the reservation records: those of runs whose keys expired are removed, the run's
 *    own are queued for when its keys expire, and the run's open reservations are read) and each
 *    other key (its request key). Beside them, the run's blob keys are read (its slot).
 * 2. The run's own keys get their expiry and its tombstone in one script, only if the snapshot
 *    still says the run ended that way and that was not done already; beside it, the run leaves
 *    the active runs and is noted as ended (one script), and its end is noted in the run list.
 *
 * What a crash leaves: after (1), the run is still active, so a sweep (or a redelivered job)
 * comes here again; the expiries of (1) are set only where none is, so doing it again changes
 * nothing. Within (2), the removal from the active runs may land without the run's expiry: the
 * note among the runs that ended lately stays, and the sweep that reads those notes finds the run
 * ended without a tombstone and comes here again (`worker/reconcile.ts`). With that check turned
 * off (`endedRunsCheckMs: 0`) nothing would read the note, so the run leaves the active runs only
 * once its expiry is set: a third round trip. A run resumed between the two (the script finds it
 * not ended) keeps its keys again: the expiries of (1) are taken back, as a resume does. A failed
 * run given the expiry of failed runs, then cancelled, gets that of finished runs on the keys of
 * other slots in a third round trip (the first kept the expiry they had).
 */
import type { Redis } from 'ioredis';
import type { ActiveRuns } from './active-runs.js';
import type { Keys } from './keys.js';
import { classifyRedisError } from './redis-errors.js';
import type { RetentionStore, RunKeyInfo } from './retention.js';
import type { RunIndex } from './run-index.js';

/** How a run ended. */
export type EndedStatus = 'succeeded' | 'failed' | 'cancelled';

/** What {@link RunEnd.end} found and did. */
export interface RunEndResult {
  /**
   * What the expiry script of the run's own keys replied (see `RetentionStore.expireRun`), or null
   * when the run is kept (a failed run without `failedRunsMs`).
   */
  expired: number | null;
  /** The ids of the run's reservations not yet reconciled, as read at its end. */
  open: string[];
}

/** The end of a run (see the module comment). */
export interface RunEnd {
  /** Ends `runId`, which ended with `status` (as the caller's snapshot says). */
  end(runId: string, info: RunKeyInfo, status: EndedStatus): Promise<RunEndResult>;
}

/*
 * tenant: the run's keys in its tenant's slot get their expiry (unless they have one), the
 * reservation records of runs whose keys expired go, the run's own are queued, and the run's
 * open reservations are read.
 *   KEYS[1] the queue of expiring records (ZSET)   KEYS[2] the tenant's reservation records (HASH)
 *   KEYS[3] the run's reservation ids (LIST)   KEYS[4] the run's open reservations (SET)
 *   KEYS[5..] the run's keys in the tenant's slot, to expire
 *   ARGV[1] now, epoch ms   ARGV[2] the expiry, ms ('' : none, the run is kept)   ARGV[3] the run
 *   ARGV[4] 'replace': the expiry replaces one the keys have (that of the failed run it was)
 *   Returns the run's open reservation ids (SMEMBERS)
 * A queue member is `{"runId":…,"ids":[…]}`, written the same way each time, added only when the
 * run has none (ZADD NX), so a second end keeps the first one's time (but with 'replace').
 */
const TENANT = `
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 100)
for _, member in ipairs(due) do
  local ok, queued = pcall(cjson.decode, member)
  if ok and type(queued) == 'table' and type(queued['ids']) == 'table' then
    for _, id in ipairs(queued['ids']) do
      if type(id) == 'string' then redis.call('HDEL', KEYS[2], id) end
    end
  end
  redis.call('ZREM', KEYS[1], member)
end
local replace = ARGV[4] == 'replace'
if ARGV[2] ~= '' then
  for i = 5, #KEYS do
    if replace or redis.call('PTTL', KEYS[i]) == -1 then redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
  end
  local ids = redis.call('LRANGE', KEYS[3], 0, -1)
  if #ids > 0 then
    local member = '{"runId":' .. cjson.encode(ARGV[3]) .. ',"ids":' .. cjson.encode(ids) .. '}'
    local score = tonumber(ARGV[1]) + tonumber(ARGV[2])
    if replace then redis.call('ZADD', KEYS[1], score, member)
    else redis.call('ZADD', KEYS[1], 'NX', score, member) end
  end
end
return redis.call('SMEMBERS', KEYS[4])
`;

/*
 * expireUnset: a key gets an expiry unless it has one (but with 'replace').
 *   KEYS[1] the key   ARGV[1] the expiry, ms   ARGV[2] 'replace': whether it has one or not
 */
const EXPIRE_UNSET = `
if ARGV[2] == 'replace' or redis.call('PTTL', KEYS[1]) == -1 then
  return redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 0
`;

const TENANT_COMMAND = 'flujoRunEnd_tenant_v1';
const EXPIRE_UNSET_COMMAND = 'flujoRunEnd_expireUnset_v1';
type Script<T> = (...args: string[]) => Promise<T>;

/** Options of {@link createRunEnd}. */
export interface RunEndOptions {
  redis: Redis;
  keys: Keys;
  retention: RetentionStore;
  activeRuns: ActiveRuns;
  runs: RunIndex;
  /** @defaultValue `Date.now` */
  clock?: () => number;
}

/** Creates the {@link RunEnd} of `keys`' prefix on `redis`. */
export function createRunEnd(options: RunEndOptions): RunEnd {
  const { redis, keys, retention, activeRuns, runs } = options;
  const clock = options.clock ?? Date.now;
  const commands = redis as unknown as Record<string, Script<unknown> | undefined>;
  const script = <T>(name: string, lua: string, numberOfKeys?: number): Script<T> => {
    if (commands[name] === undefined) {
      redis.defineCommand(name, numberOfKeys === undefined ? { lua } : { numberOfKeys, lua });
    }
    return (...args) => (commands[name] as Script<T>).apply(redis, args);
  };
  const tenantScript = script<string[]>(TENANT_COMMAND, TENANT);
  const expireUnset = script<number>(EXPIRE_UNSET_COMMAND, EXPIRE_UNSET, 1);

  /** Round trip 1: the keys of other slots, the reservation records; the run's blob keys. */
  async function outside(
    runId: string,
    info: RunKeyInfo,
    ms: number | null,
    replace = false,
  ): Promise<{ open: string[]; blobs: string[] }> {
    const { tenant, other } = retention.keysWith(runId, info, []);
    const { tenantId } = info;
    const fixed = [
      keys.expiringReservations(tenantId),
      keys.reservations(tenantId),
      keys.runReservations(tenantId, runId),
      keys.openReservations(tenantId, runId),
    ];
    const expiry = ms === null ? '' : String(ms);
    const how = replace ? 'replace' : 'unset';
    const [open, blobs] = await Promise.all([
      tenantScript(
        String(fixed.length + tenant.length),
        ...fixed,
        ...tenant,
        String(clock()),
        expiry,
        runId,
        how,
      ),
      ms === null || replace ? [] : retention.blobKeys(runId),
      ...(ms === null ? [] : other.map((key) => expireUnset(key, expiry, how))),
    ]);
    return { open, blobs };
  }

  return {
    async end(runId, info, status) {
      const at = clock();
      const failed = status === 'failed';
      const ms = failed ? retention.failedRunsMs : retention.finishedRunsMs;
      let first: { open: string[]; blobs: string[] };
      try {
        first = await outside(runId, info, ms);
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
      const expiring =
        ms === null
          ? Promise.resolve(null)
          : retention.expireRun(
              runId,
              retention.keysWith(runId, info, first.blobs).run,
              failed,
              ms,
            );
      // Without the sweep's check of the runs that ended, the run leaves the active runs only once
      // its expiry is set (see the module comment).
      const leaving =
        activeRuns.endedWindowMs > 0
          ? activeRuns.ended(runId)
          : expiring.then(() => activeRuns.ended(runId));
      const [expired] = await Promise.all([
        expiring,
        leaving,
        runs.endedOnce(runId, status, at, ms).catch(() => {}), // healed by the list if lost
      ]);
      // Resumed meanwhile: the keys of other slots (and its list entry) go on without an expiry.
      if (expired === 0) {
        await retention.keep(runId, info);
        await runs.reopened(runId);
      }
      // A failed run given its expiry that ends otherwise now (cancelled): the keys of other slots
      // kept the failed run's expiry in (1), and get that of finished runs.
      if (expired === 4) await outside(runId, info, ms, true);
      return { expired, open: first.open };
    },
  };
}
