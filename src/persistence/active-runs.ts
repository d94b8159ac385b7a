/**
 * The set of runs that are not finished: a run is added before it is created (or when it is
 * resumed or replayed) and removed once its keys got their expiry. A worker that starts walks it
 * to hand every unfinished run's due work to the queue again.
 */
import type { Redis } from 'ioredis';
import type { ReplicaAck } from './replicas.js';
import type { Keys } from './keys.js';

/** Reads and writes the active runs of one prefix. */
export interface ActiveRuns {
  /** Notes a run as active (a no-op when it is). */
  add(runId: string): Promise<void>;
  /** Notes a run as finished (a no-op when it is not active). */
  remove(runId: string): Promise<void>;
  /**
   * Calls `each` with every active run id, a page of at most `count` ids at a time, awaiting it
   * before the next page is read. A run added or removed meanwhile may be met or not.
   */
  forEach(each: (runId: string) => Promise<void>, count?: number): Promise<void>;
}

/** Creates the {@link ActiveRuns} of `keys`' prefix on `redis`. */
export function createActiveRuns(redis: Redis, keys: Keys, replicas?: ReplicaAck): ActiveRuns {
  const key = keys.activeRuns();
  return {
    async add(runId) {
      await redis.sadd(key, runId);
      // Before the run's first job: a sweep finds the run even if that job is lost.
      if (replicas !== undefined) await replicas.ack(key);
    },
    async remove(runId) {
      await redis.srem(key, runId);
    },
    async forEach(each, count = 500) {
      let cursor = '0';
      do {
        const [next, ids] = await redis.sscan(key, cursor, 'COUNT', count);
        cursor = next;
        for (const runId of ids) await each(runId);
      } while (cursor !== '0');
    },
  };
}
