/**
 * Lineage of runs: which runs replay a run. A replaying run names its original in its own meta;
 * the original lists its replays here, so either side can show the lineage.
 */
import type { Redis } from 'ioredis';
import { createKeys } from './keys.js';
import { classifyRedisError } from './redis-errors.js';

/** One replay of a run, as its original lists it. */
export interface ReplayLink {
  runId: string;
  mode: 'replay' | 'regenerate';
  /** When the replay was created, epoch ms. */
  at: number;
}

/** The replays of each run. */
export interface LineageStore {
  /** Adds `link` to the replays of `runId`. */
  add(runId: string, link: ReplayLink): Promise<void>;
  /** The replays of `runId`, oldest first (empty when none). */
  list(runId: string): Promise<ReplayLink[]>;
}

/** Creates the Redis-backed {@link LineageStore} (a LIST per run, see `keys.replays`). */
export function createLineageStore(options: { redis: Redis; prefix?: string }): LineageStore {
  const { redis } = options;
  const keys = createKeys(options.prefix);
  return {
    /*
     * add.  Written keys: replays (RPUSH).
     */
    async add(runId, link) {
      try {
        await redis.rpush(keys.replays(runId), JSON.stringify(link));
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
    },
    /*
     * list.  Reads: replays (LRANGE); entries that are not links are left out.
     */
    async list(runId) {
      let raw: string[];
      try {
        raw = await redis.lrange(keys.replays(runId), 0, -1);
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
      const out: ReplayLink[] = [];
      for (const text of raw) {
        try {
          const v = JSON.parse(text) as Partial<ReplayLink>;
          if (typeof v.runId === 'string') {
            out.push({
              runId: v.runId,
              mode: v.mode === 'regenerate' ? 'regenerate' : 'replay',
              at: Number(v.at ?? 0),
            });
          }
        } catch {
          // not a link: skipped
        }
      }
      return out;
    },
  };
}
