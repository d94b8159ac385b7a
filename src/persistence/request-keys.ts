/**
 * Request keys: a caller's own key for a start request (`start(..., { requestKey })`), claimed
 * once per tenant for the run it started, so a repeated request leads to the same run.
 */
import type { Redis } from 'ioredis';
import type { ReplicaAck } from './replicas.js';
import type { Keys } from './keys.js';

/** The request keys of one prefix. */
export interface RequestKeys {
  /** The run that claimed `requestKey` of `tenantId`, or null when none did. */
  owner(tenantId: string, requestKey: string): Promise<string | null>;
  /**
   * Claims `requestKey` of `tenantId` for `runId` unless another run did: returns null when this
   * call claimed it, else the run that holds it.
   */
  claim(tenantId: string, requestKey: string, runId: string): Promise<string | null>;
}

/** Creates the {@link RequestKeys} of `keys`' prefix on `redis`. */
export function createRequestKeys(redis: Redis, keys: Keys, replicas?: ReplicaAck): RequestKeys {
  return {
    owner: (tenantId, requestKey) => redis.get(keys.requestKey(tenantId, requestKey)),
    async claim(tenantId, requestKey, runId) {
      const key = keys.requestKey(tenantId, requestKey);
      if ((await redis.set(key, runId, 'NX')) !== null) {
        // The run is created next: a failover must not lose the key and let a retry make another.
        if (replicas !== undefined) await replicas.ack(key);
        return null;
      }
      // Claimed by another start; a key that lapsed in between leaves this run as the owner.
      return (await redis.get(key)) ?? runId;
    },
  };
}
