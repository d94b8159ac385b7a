/**
 * The fingerprints of agent steps, per run and step. The first execution of a step (a granular
 * step's first turn, an atomic step's first attempt) claims it before it persists anything else
 * (its first usage reservation, journal entry or held tool call), and every later execution
 * compares its own with it. A granular step's snapshot also keeps the fingerprint's hash (written
 * with every turn), which its later turns compare with; the per-field hashes that name what
 * changed are read only when a hash differs.
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
  /**
   * Records `fingerprint` for the step unless one is recorded (first writer wins), and returns
   * the recorded one: the caller's, or the one recorded first. Throws `SnapshotCorruptError` when
   * the recorded one is unreadable. A step's fallback agent (`fallback`) has a fingerprint of its
   * own, field `<stepId>#fallback` (step ids never hold '#').
   */
  claim(
    runId: string,
    stepId: string,
    fingerprint: StoredFingerprint,
    fallback?: boolean,
  ): Promise<StoredFingerprint>;
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
    /*
     * claim: first writer wins per (run, step).
     *   Written keys:  fingerprints (HSETNX field)
     *   Reads:         fingerprints (HGET field), only when HSETNX wrote nothing
     */
    async claim(runId, stepId, fingerprint, fallback = false) {
      assertStepId(stepId);
      const key = keys.fingerprints(runId);
      const field = fallback ? `${stepId}#fallback` : stepId;
      let raw: string | null;
      try {
        if ((await redis.hsetnx(key, field, JSON.stringify(fingerprint))) === 1) {
          return fingerprint;
        }
        raw = await redis.hget(key, field);
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
      return raw === null ? fingerprint : parse(runId, stepId, raw);
    },
    async get(runId, stepId) {
      assertStepId(stepId);
      let raw: string | null;
      try {
        raw = await redis.hget(keys.fingerprints(runId), stepId);
      } catch (error) {
        throw classifyRedisError(error, redis);
      }
      return raw === null ? null : parse(runId, stepId, raw);
    },
  };
}

function parse(runId: string, stepId: string, raw: string): StoredFingerprint {
  try {
    return storedSchema.parse(JSON.parse(raw));
  } catch (cause) {
    throw new SnapshotCorruptError(runId, `the fingerprint of step "${stepId}" is unreadable`, {
      cause,
    });
  }
}
