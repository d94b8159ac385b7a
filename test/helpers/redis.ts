import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { inject } from 'vitest';
import {
  isCluster,
  isClusterUrl,
  openRedis,
  type RedisClient,
} from '../../src/persistence/connection.js';

/**
 * The URL of the suite's Redis (see test/integration/global-setup.ts): one redis-server, or in the
 * `cluster` project a Redis Cluster's `redis+cluster://…` URL (test/integration/cluster-global-setup.ts).
 */
export function redisUrl(): string {
  return inject('redisUrl');
}

/** Whether the suite runs on one redis-server or on a Redis Cluster. */
export function redisMode(): 'single' | 'cluster' {
  return isClusterUrl(redisUrl()) ? 'cluster' : 'single';
}

/**
 * A fresh client on the suite's Redis: a `Redis` on one server; on a cluster an ioredis `Cluster`
 * (opened by the runtime's own `openRedis`), used through the same command interface.
 */
export function connect(): Redis {
  const url = redisUrl();
  if (isClusterUrl(url)) return openRedis(url, { timeoutMs: 5000 });
  return new Redis(url, { lazyConnect: false, maxRetriesPerRequest: 1 });
}

/** A random key prefix, so that test files can run in parallel on one server. */
export function testPrefix(): string {
  return `t-${randomUUID().slice(0, 8)}`;
}

/** Whether `redis` is a cluster client (without narrowing its type, as `isCluster` would). */
function onCluster(redis: Redis): boolean {
  return isCluster(redis);
}

/**
 * The servers that hold the data: the client itself on one server; on a cluster a connection to
 * each master (each holds only the keys of its own slots), once the cluster client knows them.
 * For what one server answers about itself (SCAN, INFO): on a cluster ask each of these.
 */
export async function dataNodes(redis: RedisClient): Promise<Redis[]> {
  if (!isCluster(redis)) return [redis];
  if (redis.status !== 'ready') {
    await new Promise<void>((resolve, reject) => {
      redis.once('ready', resolve);
      redis.once('end', () => reject(new Error('cluster client ended before it was ready')));
    });
  }
  return redis.nodes('master');
}

/** Every key matching `pattern` (SCAN, never KEYS), over every master on a cluster. */
export async function scanKeys(redis: Redis, pattern: string): Promise<string[]> {
  const found: string[] = [];
  for (const node of await dataNodes(redis)) {
    let cursor = '0';
    do {
      const [next, keys] = await node.scan(cursor, 'MATCH', pattern, 'COUNT', 500);
      cursor = next;
      found.push(...keys);
    } while (cursor !== '0');
  }
  return found;
}

/**
 * Deletes every key under `prefix` (SCAN, never KEYS). On a cluster one DEL per key, since the
 * keys of one call must share a slot.
 */
export async function deletePrefix(redis: Redis, prefix: string): Promise<void> {
  const keys = await scanKeys(redis, `${prefix}*`);
  if (onCluster(redis)) {
    await Promise.all(keys.map((key) => redis.del(key)));
    return;
  }
  for (let i = 0; i < keys.length; i += 500) await redis.del(...keys.slice(i, i + 500));
}

/** Deletes every key a runtime with key prefix `prefix` wrote: its own and its BullMQ queue's. */
export async function deleteRuntimeKeys(prefix: string): Promise<void> {
  const redis = connect();
  try {
    await deletePrefix(redis, prefix);
    await deletePrefix(redis, `{${prefix}:q}`);
    await deletePrefix(redis, `{${prefix}:runs}`);
    await deletePrefix(redis, `{${prefix}:active-runs}`);
    await deletePrefix(redis, `{${prefix}:schedules}`);
    await deletePrefix(redis, `{${prefix}:workers}`);
    await deletePrefix(redis, `{${prefix}:rate:`);
    await deletePrefix(redis, `{${prefix}:conc:`);
    await deletePrefix(redis, `{${prefix}:singletons:`);
    await deletePrefix(redis, `{${prefix}:debounce:`);
  } finally {
    redis.disconnect();
  }
}

/** Every key under `prefix` with its contents: to assert that a refused write changed nothing. */
export async function readPrefix(redis: Redis, prefix: string): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  for (const key of (await scanKeys(redis, `${prefix}*`)).sort()) {
    const type = await redis.type(key);
    if (type === 'hash') out[key] = { hash: await redis.hgetall(key) };
    else if (type === 'list') out[key] = { list: await redis.lrange(key, 0, -1) };
    else if (type === 'string') out[key] = { string: await redis.get(key) };
    else if (type === 'set') out[key] = { set: (await redis.smembers(key)).sort() };
    else out[key] = { type };
  }
  return out;
}

/**
 * {@link readPrefix} once the keys stop changing (two reads 50 ms apart agree, within 5 s): a
 * worker's work after a run's final commit (its expiry, its index entries) is then done, so a
 * later read that differs shows what the code under test changed.
 */
export async function readQuietPrefix(
  redis: Redis,
  prefix: string,
): Promise<Record<string, unknown>> {
  const deadline = Date.now() + 5000;
  let last = await readPrefix(redis, prefix);
  for (;;) {
    await new Promise((ok) => setTimeout(ok, 50));
    const next = await readPrefix(redis, prefix);
    if (JSON.stringify(next) === JSON.stringify(last) || Date.now() > deadline) return next;
    last = next;
  }
}
