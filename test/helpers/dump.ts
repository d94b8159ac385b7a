import type { Redis } from 'ioredis';
import { scanKeys } from './redis.js';

/** A key's DUMP (base64), and whether it has a time to live. */
export interface DumpedKey {
  dump: string;
  expires: boolean;
}

/**
 * Every key of a runtime's prefix and of its BullMQ queue, with its DUMP and whether it expires
 * (over every master on a cluster).
 */
export async function dumpAll(redis: Redis, prefix: string): Promise<Record<string, DumpedKey>> {
  const out: Record<string, DumpedKey> = {};
  for (const pattern of [`${prefix}:*`, `{${prefix}:q}*`]) {
    for (const key of await scanKeys(redis, pattern)) {
      const [dump, ttl] = await Promise.all([redis.dumpBuffer(key), redis.pttl(key)]);
      if (dump !== null) out[key] = { dump: dump.toString('base64'), expires: ttl > 0 };
    }
  }
  return out;
}

/**
 * What changed between two dumps: keys added, keys whose value changed, and keys gone that had no
 * time to live (a key with one, e.g. a lock of BullMQ's, may expire meanwhile). Empty: no write.
 */
export function changedKeys(
  before: Record<string, DumpedKey>,
  after: Record<string, DumpedKey>,
): string[] {
  const changed: string[] = [];
  for (const [key, value] of Object.entries(after)) {
    const was = before[key];
    if (was === undefined) changed.push(`added ${key}`);
    else if (was.dump !== value.dump) changed.push(`changed ${key}`);
  }
  for (const [key, value] of Object.entries(before)) {
    if (after[key] === undefined && !value.expires) changed.push(`deleted ${key}`);
  }
  return changed;
}
