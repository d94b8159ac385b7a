/**
 * The run list: every run of a prefix in a sorted set by start time, with what the list shows of
 * it (plan, tenant, start; once it ended, its final status and end) in a hash beside it. Both keys
 * share one hash tag, so under Redis Cluster they live in one slot.
 *
 * The index is written beside the run, not inside its commits (a run's keys live in the run's own
 * slot): an entry is added before the run is created, and its end is noted after the commit that
 * ended it. What can go wrong is healed when the list is read: an entry whose run does not exist
 * (a crash before the create, or a run whose keys expired) is removed; a run that ended without its
 * end noted is read from its snapshot and noted then.
 */
import type { Redis } from 'ioredis';
import type { Keys } from './keys.js';

/** What the index holds of one run. */
export interface RunIndexEntry {
  runId: string;
  planName: string;
  tenantId: string;
  createdAt: number;
  /** A child run's parent run (absent for a run without one). */
  parentRunId?: string | null;
  /** Once the run ended: its final status and when. */
  end: { status: string; at: number } | null;
}

/** Reads and writes the run list of one prefix. */
export interface RunIndex {
  /** Adds a run (before it is created). */
  add(entry: Omit<RunIndexEntry, 'end'>): Promise<void>;
  /** Whether the index has an entry for the run. */
  has(runId: string): Promise<boolean>;
  /** Notes that a run ended with `status` at `at`. */
  ended(runId: string, status: string, at: number): Promise<void>;
  /**
   * Notes that a run ended with `status` at `at` unless an end is noted already (a run's end path
   * may run again for one end: the first one noted stays; a resume forgets it), and, with
   * `expiresInMs` (its keys' expiry; null: kept), queues its entry for removal then. Removes the
   * entries of runs whose keys expired (at most 100 a call), in the same script.
   */
  endedOnce(runId: string, status: string, at: number, expiresInMs: number | null): Promise<void>;
  /** Removes the entries of runs whose keys expired (at most 100); how many it removed. */
  dropExpired(): Promise<number>;
  /** Forgets a run's end (it was resumed). */
  reopened(runId: string): Promise<void>;
  /** Entries newest first with `createdAt` in `[since, until]`, from position `offset`. */
  page(since: number, until: number, offset: number, count: number): Promise<RunIndexEntry[]>;
  /** Removes runs from the index. */
  remove(runIds: readonly string[]): Promise<void>;
  /**
   * Removes entries of runs that ended before `before.finished`, but of runs that failed only those
   * that ended before `before.failed`, and none when that is null (failed runs are kept). Looks at
   * the oldest entries, `batch` at a time, stepping over those it keeps, at most
   * {@link TRIM_PAGES} batches a call; returns how many were removed.
   */
  trim(before: { finished: number; failed: number | null }, batch?: number): Promise<number>;
}

/**
 * The most batches one trim looks at: entries that are kept (runs that have not ended, failed runs
 * that are kept) are stepped over, so that they do not hold up the trim of the entries after them.
 */
export const TRIM_PAGES = 4;

const endField = (runId: string) => `${runId}\nend`;

/*
 * add: lists a run (ZADD index createdAt runId; HSET info runId what-the-list-shows; HDEL info
 * runId's end), atomically, in one command: a start pays for one round trip of a small script
 * rather than a MULTI of five commands.
 */
const ADD_LUA = `redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('HDEL', KEYS[2], ARGV[4])
return 1`;
const ADD_COMMAND = 'flujoRunIndex_add_v1';

/*
 * ended: notes a run's end unless one is noted, queues its entry for removal when its keys expire,
 * and removes the entries that are due.
 *   KEYS[1] the index (ZSET)   KEYS[2] the info (HASH)   KEYS[3] the entries to remove (ZSET)
 *   ARGV[1] the run   ARGV[2] its end field   ARGV[3] `<status> <at>`   ARGV[4] now, epoch ms
 *   ARGV[5] its keys' expiry, ms ('': kept). With ARGV[1] '', only removes the entries that are due.
 */
const ENDED_LUA = `local now = tonumber(ARGV[4])
if ARGV[1] ~= '' then
  redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3])
  if ARGV[5] ~= '' then redis.call('ZADD', KEYS[3], 'NX', now + tonumber(ARGV[5]), ARGV[1]) end
end
local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id, id .. '\\nend')
  redis.call('ZREM', KEYS[3], id)
end
return #due`;
const ENDED_COMMAND = 'flujoRunIndex_ended_v1';

type AddScript = (...args: string[]) => Promise<number>;

/** The `add` script on `redis`, registered once per client (ioredis runs EVALSHA, then EVAL). */
function addScript(redis: Redis): AddScript {
  const commands = redis as unknown as Record<string, AddScript | undefined>;
  if (commands[ADD_COMMAND] === undefined) {
    redis.defineCommand(ADD_COMMAND, { numberOfKeys: 2, lua: ADD_LUA });
  }
  const script = commands[ADD_COMMAND] as AddScript;
  return (...args) => script.apply(redis, args);
}

/** Creates the {@link RunIndex} of `keys`' prefix on `redis`. */
export function createRunIndex(redis: Redis, keys: Keys, clock: () => number = Date.now): RunIndex {
  const index = keys.runIndex();
  const info = keys.runInfo();
  const expiring = keys.runIndexExpiring();
  const commands = redis as unknown as Record<string, AddScript | undefined>;
  if (commands[ENDED_COMMAND] === undefined) {
    redis.defineCommand(ENDED_COMMAND, { numberOfKeys: 3, lua: ENDED_LUA });
  }

  const parseEnd = (raw: string | null | undefined): RunIndexEntry['end'] => {
    if (raw === null || raw === undefined) return null;
    const [status = '', at = '0'] = raw.split(' ');
    return { status, at: Number(at) };
  };

  return {
    async add({ runId, planName, tenantId, createdAt, parentRunId }) {
      const shown = JSON.stringify({
        p: planName,
        t: tenantId,
        c: createdAt,
        ...(parentRunId == null ? {} : { pr: parentRunId }),
      });
      await addScript(redis)(index, info, String(createdAt), runId, shown, endField(runId));
    },
    async has(runId) {
      return (await redis.zscore(index, runId)) !== null;
    },
    async ended(runId, status, at) {
      await redis.hset(info, endField(runId), `${status} ${at}`);
    },
    async endedOnce(runId, status, at, expiresInMs) {
      await (commands[ENDED_COMMAND] as AddScript).call(
        redis,
        index,
        info,
        expiring,
        runId,
        endField(runId),
        `${status} ${at}`,
        String(clock()),
        expiresInMs === null ? '' : String(expiresInMs),
      );
    },
    async dropExpired() {
      const ended = commands[ENDED_COMMAND] as AddScript;
      return ended.call(redis, index, info, expiring, '', '', '', String(clock()), '');
    },
    async reopened(runId) {
      await redis.multi().hdel(info, endField(runId)).zrem(expiring, runId).exec();
    },
    async page(since, until, offset, count) {
      const ids = await redis.zrevrangebyscore(
        index,
        Number.isFinite(until) ? until : '+inf',
        Number.isFinite(since) ? since : '-inf',
        'LIMIT',
        offset,
        count,
      );
      if (ids.length === 0) return [];
      const fields = ids.flatMap((id) => [id, endField(id)]);
      const values = await redis.hmget(info, ...fields);
      return ids.map((runId, i) => {
        const raw = values[2 * i];
        let known: { p?: string; t?: string; c?: number; pr?: string } = {};
        try {
          known = raw == null ? {} : (JSON.parse(raw) as typeof known);
        } catch {
          // An unreadable entry shows what the run's own keys say (see the list).
        }
        return {
          runId,
          planName: known.p ?? '',
          tenantId: known.t ?? '',
          createdAt: known.c ?? 0,
          parentRunId: known.pr ?? null,
          end: parseEnd(values[2 * i + 1]),
        };
      });
    },
    async remove(runIds) {
      if (runIds.length === 0) return;
      await redis
        .multi()
        .zrem(index, ...runIds)
        .hdel(info, ...runIds.flatMap((id) => [id, endField(id)]))
        .exec();
    },
    async trim(before, batch = 500) {
      // A run ends after it starts: only entries that started before the cut can have ended before it.
      const cut =
        before.failed === null ? before.finished : Math.max(before.finished, before.failed);
      let removed = 0;
      // Entries kept are stepped over: the next batch starts after those of this one.
      for (let offset = 0, pages = 0; pages < TRIM_PAGES; pages++) {
        const ids = await redis.zrangebyscore(index, '-inf', cut, 'LIMIT', offset, batch);
        if (ids.length === 0) break;
        const ends = await redis.hmget(info, ...ids.map(endField));
        const old = ids.filter((_, i) => {
          const end = parseEnd(ends[i]);
          if (end === null) return false;
          const by = end.status === 'failed' ? before.failed : before.finished;
          return by !== null && end.at < by;
        });
        await this.remove(old);
        removed += old.length;
        offset += ids.length - old.length;
        if (ids.length < batch) break;
      }
      return removed;
    },
  };
}
