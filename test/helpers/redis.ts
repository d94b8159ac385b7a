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
