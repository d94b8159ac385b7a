/**
 * Cached step outputs, tenant-wide (keys in the tenant's hash tag `{t:<tenantId>}`), under the hash
 * of a step's code identity, input and dependencies' outputs. An entry lives for the cache's
 * retention (an external entry for its own `ttlMs` when shorter); an entry larger than the size cap
 * is not stored. A deterministic step's output hash is also kept in a digest that outlives the
 * entry (`digestRetentionMs`), so a re-run after the entry expired is still checked byte-wise.
 *
 * Keys: `cacheEntry(tenant, hash)` STRING, the entry's JSON, PX = its lifetime;
 * `cacheDigest(tenant, hash)` STRING `<outputHash> <runId> <storedAt>`, PX = digest retention.
 */
import type { Redis } from 'ioredis';
import { ConfigurationError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import { createKeys } from './keys.js';
import { classifyRedisError } from './redis-errors.js';

/** How long a cache entry is kept by default: 7 days. */
export const DEFAULT_CACHE_RETENTION_MS = 7 * 24 * 60 * 60 * 1000;
/** How long a deterministic step's output hash is kept by default: 90 days. */
export const DEFAULT_CACHE_DIGEST_RETENTION_MS = 90 * 24 * 60 * 60 * 1000;
/** The default cap on one entry's size (its JSON, UTF-8 bytes): 1 MiB. */
export const DEFAULT_MAX_CACHE_ENTRY_BYTES = 1024 * 1024;

/** The cache classes that store entries. */
export type CacheClass = 'deterministic' | 'stable_nondeterministic' | 'external';

/** One cached output with where it came from. */
export interface CacheEntry {
  cacheClass: CacheClass;
  output: JsonValue;
  /** SHA-256 of the output's canonical JSON. */
  outputHash: string;
  /** The run and step that stored it, and when (epoch ms). */
  runId: string;
  stepId: string;
  storedAt: number;
  /** The step's code identity (operator or agent name and version). */
  identity: JsonValue;
  /** A stable nondeterministic entry's input, dependencies' outputs and parameters. */
  inputs?: JsonValue;
  /** An external entry's provenance, fetch time and expiry (epoch ms). */
  provenance?: string;
  fetchedAt?: number;
  expiresAt?: number;
}

/** A deterministic step's stored output hash. */
export interface CacheDigest {
  outputHash: string;
  runId: string;
  storedAt: number;
}

/** Options of {@link createCacheStore} (and of `createRuntime({ cache })`). */
export interface CacheStoreOptions {
  redis: Redis;
  /** Key prefix. @defaultValue `'flujo'` */
  prefix?: string;
  /** How long an entry is kept after it is stored, in ms. @defaultValue 7 days */
  retentionMs?: number;
  /** How long a deterministic step's output hash is kept, in ms. @defaultValue 90 days */
  digestRetentionMs?: number;
  /** The largest entry stored (its JSON, in UTF-8 bytes); a larger one is not cached. @defaultValue 1 MiB */
  maxEntryBytes?: number;
}

/** Cached step outputs of every tenant. */
export interface CacheStore {
  /** The entry stored under `hash` for the tenant, or null (none, expired or unreadable). */
  get(tenantId: string, hash: string): Promise<CacheEntry | null>;
  /** A deterministic step's stored output hash, or null. */
  digest(tenantId: string, hash: string): Promise<CacheDigest | null>;
  /**
   * Stores `entry` for the retention (or until `entry.expiresAt`, when sooner); a deterministic
   * entry's digest too. Returns false when the entry is over the size cap (its digest is kept).
   */
  put(tenantId: string, hash: string, entry: CacheEntry): Promise<boolean>;
}

function positiveOption(value: number | undefined, field: string, fallback: number): number {
  if (value === undefined) return fallback;
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new ConfigurationError(
      `createRuntime({ cache }): ${field} must be a positive integer (ms or bytes), got ${String(value)}.`,
      { field: `cache.${field}` },
    );
  }
  return value;
}

/** The cache's limits with their defaults; throws `ConfigurationError` naming a bad one. */
export function resolveCacheLimits(
  options: Pick<CacheStoreOptions, 'retentionMs' | 'digestRetentionMs' | 'maxEntryBytes'>,
): Required<Pick<CacheStoreOptions, 'retentionMs' | 'digestRetentionMs' | 'maxEntryBytes'>> {
  return {
    retentionMs: positiveOption(options.retentionMs, 'retentionMs', DEFAULT_CACHE_RETENTION_MS),
    digestRetentionMs: positiveOption(
      options.digestRetentionMs,
      'digestRetentionMs',
      DEFAULT_CACHE_DIGEST_RETENTION_MS,
    ),
    maxEntryBytes: positiveOption(
      options.maxEntryBytes,
      'maxEntryBytes',
      DEFAULT_MAX_CACHE_ENTRY_BYTES,
    ),
  };
}

/** A {@link CacheStore} on Redis. */
export function createCacheStore(options: CacheStoreOptions): CacheStore {
  const { redis } = options;
  const keys = createKeys(options.prefix);
  const { retentionMs, digestRetentionMs, maxEntryBytes } = resolveCacheLimits(options);

  async function redisCall<T>(op: () => Promise<T>): Promise<T> {
    try {
      return await op();
    } catch (error) {
      throw classifyRedisError(error, redis);
    }
  }

  return {
    async get(tenantId, hash) {
      const raw = await redisCall(() => redis.get(keys.cacheEntry(tenantId, hash)));
      if (raw === null) return null;
      try {
        return JSON.parse(raw) as CacheEntry;
      } catch {
        // An unreadable entry is a miss: the step runs and stores a good one over it.
        return null;
      }
    },

    async digest(tenantId, hash) {
      const raw = await redisCall(() => redis.get(keys.cacheDigest(tenantId, hash)));
      if (raw === null) return null;
      const [outputHash, runId, storedAt] = raw.split(' ');
      if (outputHash === undefined || runId === undefined) return null;
      return { outputHash, runId, storedAt: Number(storedAt ?? 0) };
    },

    async put(tenantId, hash, entry) {
      const text = JSON.stringify(entry);
      const fits = Buffer.byteLength(text, 'utf8') <= maxEntryBytes;
      const lifetime =
        entry.expiresAt === undefined
          ? retentionMs
          : Math.min(retentionMs, Math.max(1, entry.expiresAt - entry.storedAt));
      const pipeline = redis.multi();
      if (fits) pipeline.set(keys.cacheEntry(tenantId, hash), text, 'PX', lifetime);
      if (entry.cacheClass === 'deterministic') {
        const digest = `${entry.outputHash} ${entry.runId} ${entry.storedAt}`;
        pipeline.set(keys.cacheDigest(tenantId, hash), digest, 'PX', digestRetentionMs);
      }
      const replies = await redisCall(() => pipeline.exec());
      for (const [error] of replies ?? [])
        if (error !== null) throw classifyRedisError(error, redis);
      return fits;
    },
  };
}
