import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { inject } from 'vitest';

/** The URL of the suite's redis-server (see test/global-setup.ts). */
export function redisUrl(): string {
  return inject('redisUrl');
}

/** A fresh client on the suite's Redis. */
export function connect(): Redis {
  return new Redis(redisUrl(), { lazyConnect: false, maxRetriesPerRequest: 1 });
}

/** A random key prefix, so that test files can run in parallel on one server. */
export function testPrefix(): string {
  return `t-${randomUUID().slice(0, 8)}`;
}

/** Deletes every key under `prefix` (SCAN, never KEYS). */
export async function deletePrefix(redis: Redis, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 500);
    cursor = next;
    if (keys.length > 0) await redis.del(...keys);
  } while (cursor !== '0');
}

/** Deletes every key a runtime with key prefix `prefix` wrote: its own and its BullMQ queue's. */
export async function deleteRuntimeKeys(prefix: string): Promise<void> {
  const redis = connect();
  try {
    await deletePrefix(redis, prefix);
    await deletePrefix(redis, `{${prefix}:q}`);
    await deletePrefix(redis, `{${prefix}:runs}`);
    await deletePrefix(redis, `{${prefix}:active-runs}`);
  } finally {
    redis.disconnect();
  }
}

/** Every key under `prefix` with its contents: to assert that a refused write changed nothing. */
export async function readPrefix(redis: Redis, prefix: string): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 500);
    cursor = next;
    for (const key of keys) {
      const type = await redis.type(key);
      if (type === 'hash') out[key] = { hash: await redis.hgetall(key) };
      else if (type === 'list') out[key] = { list: await redis.lrange(key, 0, -1) };
      else if (type === 'string') out[key] = { string: await redis.get(key) };
      else if (type === 'set') out[key] = { set: (await redis.smembers(key)).sort() };
      else out[key] = { type };
    }
  } while (cursor !== '0');
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
