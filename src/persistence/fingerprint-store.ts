/**
 * The fingerprint parts of granular agent steps. A step's snapshot keeps only the fingerprint's
 * hash (it is written on every turn); the per-field hashes that name what changed are written once,
 * by the first turn, and read only when a later turn's hash differs.
 */
import type { Redis } from 'ioredis';
import { z } from 'zod';
import { SnapshotCorruptError } from '../errors.js';
import { assertStepId, createKeys } from './keys.js';
import { classifyRedisError } from './redis-errors.js';

/** A fingerprint as stored: the hash and one hash per field (hex SHA-256 each). */
export interface StoredFingerprint {
  hash: string;
  parts: Record<string, string>;
}

const storedSchema = z.object({ hash: z.string(), parts: z.record(z.string(), z.string()) });

/** Fingerprints per run and step. */
export interface FingerprintStore {
  /** Records the fingerprint the step's first turn runs under (a later call replaces it). */
  save(runId: string, stepId: string, fingerprint: StoredFingerprint): Promise<void>;
  /** The recorded fingerprint, or null. Throws `SnapshotCorruptError` when it is unreadable. */
  get(runId: string, stepId: string): Promise<StoredFingerprint | null>;
}

/** Creates the Redis-backed {@link FingerprintStore}. */
export function createFingerprintStore(options: {
  redis: Redis;
  prefix?: string;
}): FingerprintStore {
  const { redis } = options;
  const keys = createKeys(options.prefix);
  return {
    async save(runId, stepId, fingerprint) {
      assertStepId(stepId);
      try {
        await redis.hset(keys.fingerprints(runId), stepId, JSON.stringify(fingerprint));
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
    },
    async get(runId, stepId) {
      assertStepId(stepId);
      let raw: string | null;
      try {
        raw = await redis.hget(keys.fingerprints(runId), stepId);
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
      if (raw === null) return null;
      try {
        return storedSchema.parse(JSON.parse(raw));
      } catch (cause) {
        throw new SnapshotCorruptError(runId, `the fingerprint of step "${stepId}" is unreadable`, {
          cause,
        });
      }
    },
  };
}
