/**
 * Writes acknowledged by replicas (`durability: { replicas, timeoutMs }`): after a write that an
 * effect or a next unit depends on (a snapshot commit, a run's creation, a tool call's lease, a
 * request key, an active-runs entry), the runtime sends `WAIT replicas timeoutMs` on the
 * connection that made the write and goes on only once that many replicas have it. A master that
 * fails over to one of those replicas then still has every write the runtime acted on.
 *
 * Why `WAIT` on the writing connection is enough: Redis counts, for each client, the replication
 * offset of its last write, and a replica that acknowledged an offset has every write the master
 * made before it, whoever made them. So one `WAIT` after the last write before an effect covers
 * every earlier write to that master too: a job that retries a unit whose commit was not
 * acknowledged, finds it committed and goes on, is covered by the next unit's own writes (its
 * lease before its effect, its commit before the unit after it), which go to the same master.
 *
 * On one server, concurrent acknowledgements share one `WAIT`: a `WAIT` covers every write the
 * connection made before it, so callers that arrive while one is in flight wait for it and then
 * share the next. On a Cluster, each `WAIT` goes to the master of the key's slot, in a pipeline
 * with a read of that key (which routes it there; the connection to that node made the write).
 *
 * `WAITAOF` (Redis 7.2) is not used: it counts replicas that wrote the data to their append-only
 * file, which never comes on replicas without AOF; `WAIT` counts replicas that have the data,
 * which is what a failover promotes.
 */
import type { Redis } from 'ioredis';
import { InputValidationError, ReplicasBehindError } from '../errors.js';
import { isCluster } from './connection.js';
import { classifyRedisError } from './redis-errors.js';

/** How many replicas must acknowledge a write before the runtime acts on it. */
export interface DurabilityOptions {
  /** Replicas that must have a write before an effect or the next unit (0: none waited for). */
  replicas: number;
  /**
   * How long one `WAIT` may take, in ms; a shortfall is tried again twice more, then the write's
   * caller gets a retryable `ReplicasBehindError`. @defaultValue 1000
   */
  timeoutMs?: number;
}

/** The durability a runtime was given, as checked. */
export interface CheckedDurability {
  replicas: number;
  timeoutMs: number;
}

/** The default of {@link DurabilityOptions.timeoutMs}. */
export const DEFAULT_REPLICA_TIMEOUT_MS = 1000;
/** How many `WAIT`s one acknowledgement tries before it gives up. */
export const REPLICA_WAIT_TRIES = 3;
export { ReplicasBehindError };

/** Checks `durability` as given to `createRuntime`; undefined or 0 replicas: nothing waited for. */
export function checkDurability(durability: unknown): CheckedDurability | undefined {
  if (durability === undefined) return undefined;
  const refuse = (path: string, message: string): never => {
    throw new InputValidationError('runtime options', [{ path, message }]);
  };
  if (typeof durability !== 'object' || durability === null || Array.isArray(durability)) {
    return refuse('durability', 'must be an object, e.g. durability: { replicas: 1 }');
  }
  const { replicas, timeoutMs, ...rest } = durability as Record<string, unknown>;
  const unknown = Object.keys(rest)[0];
  if (unknown !== undefined) {
    refuse(`durability.${unknown}`, 'is not an option; durability takes replicas and timeoutMs');
  }
  if (
    typeof replicas !== 'number' ||
    !Number.isInteger(replicas) ||
    replicas < 0 ||
    replicas > 16
  ) {
    refuse(
      'durability.replicas',
      `must be a whole number from 0 to 16, got ${JSON.stringify(replicas)}`,
    );
  }
  const timeout = timeoutMs ?? DEFAULT_REPLICA_TIMEOUT_MS;
  if (
    typeof timeout !== 'number' ||
    !Number.isInteger(timeout) ||
    timeout < 1 ||
    timeout > 600_000
  ) {
    refuse(
      'durability.timeoutMs',
      `must be a whole number of milliseconds from 1 to 600000, got ${JSON.stringify(timeoutMs)}`,
    );
  }
  if (replicas === 0) return undefined;
  return { replicas: replicas as number, timeoutMs: timeout as number };
}

/** Acknowledges writes by replicas: resolves once `replicas` replicas have the caller's last write. */
export interface ReplicaAck {
  readonly replicas: number;
  readonly timeoutMs: number;
  /**
   * Resolves when the write the caller made to `key`'s master (its reply already received) is on
   * the replicas asked for; rejects with `ReplicasBehindError` (or `RedisUnavailableError`).
   */
  ack(key: string): Promise<void>;
}

/** Whether `redis` is a Cluster client used through the command interface (see `asCommandClient`). */
const onCluster = (redis: Redis): boolean => isCluster(redis);

type Waiter = { resolve: () => void; reject: (error: unknown) => void; key: string };

/** One `WAIT` on the connection that wrote `key`; the number of replicas that acknowledged. */
async function waitOnce(redis: Redis, key: string, replicas: number, timeoutMs: number) {
  if (onCluster(redis)) {
    // The read of `key` sends the pipeline to that key's master: the node the write went to.
    const replies = await redis.pipeline().exists(key).call('WAIT', replicas, timeoutMs).exec();
    const [error, reply] = replies?.[1] ?? [new Error('no reply to WAIT'), null];
    if (error) throw error;
    return Number(reply);
  }
  return Number(await redis.call('WAIT', replicas, timeoutMs));
}

/** Creates the {@link ReplicaAck} of `durability` on `redis` (the connection the stores write on). */
export function createReplicaAck(redis: Redis, durability: CheckedDurability): ReplicaAck {
  const { replicas, timeoutMs } = durability;
  const acknowledge = async (key: string): Promise<void> => {
    let acknowledged = 0;
    for (let tries = 0; tries < REPLICA_WAIT_TRIES; tries++) {
      try {
        acknowledged = await waitOnce(redis, key, replicas, timeoutMs);
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
      if (acknowledged >= replicas) return;
    }
    throw new ReplicasBehindError(replicas, acknowledged, timeoutMs, key, REPLICA_WAIT_TRIES);
  };
  if (onCluster(redis)) return { replicas, timeoutMs, ack: acknowledge };

  // One server, one connection: a WAIT covers every earlier write of the connection, so the
  // callers that come while one is in flight share the next one.
  let waiting: Waiter[] = [];
  let pumping = false;
  const pump = async (): Promise<void> => {
    pumping = true;
    while (waiting.length > 0) {
      const batch = waiting;
      waiting = [];
      try {
        await acknowledge(batch[0]!.key);
        for (const w of batch) w.resolve();
      } catch (error) {
        for (const w of batch) w.reject(error);
      }
    }
    pumping = false;
  };
  return {
    replicas,
    timeoutMs,
    ack: (key) =>
      new Promise<void>((resolve, reject) => {
        waiting.push({ resolve, reject, key });
        if (!pumping) void pump();
      }),
  };
}
