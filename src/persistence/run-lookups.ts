/**
 * Small reads and writes of a run's own keys that need no snapshot store: whether the run exists,
 * its status, its newest event, and fields of its meta hash that are not part of the run (the
 * CLI's notes).
 */
import type { Redis } from 'ioredis';
import { RunKeyKind, type Keys } from './keys.js';

/** Whether the run's snapshot exists. */
export async function runExists(redis: Redis, keys: Keys, runId: string): Promise<boolean> {
  return (await redis.exists(keys.snap(runId))) !== 0;
}

/**
 * The run's status as the run field of its stored snapshot records it (`rs`), or null when there
 * is no such field or it cannot be read (no run, or a run stored whole by an older version).
 */
export function storedRunStatus(runField: string | null): string | null {
  if (runField === null) return null;
  try {
    const run = JSON.parse(runField) as { rs?: unknown };
    return typeof run.rs === 'string' ? run.rs : null;
  } catch {
    return null;
  }
}

/** Reads {@link storedRunStatus} of a run: one HGET, on the connection given. */
export async function readRunStatus(
  redis: Redis,
  keys: Keys,
  runId: string,
): Promise<string | null> {
  return storedRunStatus(await redis.hget(keys.snap(runId), 'run'));
}

/**
 * The id of the run's newest event, or undefined when its stream is empty. Read on the connection
 * given, so a read sent after it on the same connection sees nothing older.
 */
export async function lastEventId(
  redis: Redis,
  keys: Keys,
  runId: string,
): Promise<string | undefined> {
  return newestEntryId(redis, keys.events(runId));
}

/**
 * The id of the newest entry of the run's status stream (its status changes), or undefined when
 * it is empty. Read on the connection given, as {@link lastEventId}.
 */
export async function lastStatusId(
  redis: Redis,
  keys: Keys,
  runId: string,
): Promise<string | undefined> {
  return newestEntryId(redis, keys.status(runId));
}

async function newestEntryId(redis: Redis, key: string): Promise<string | undefined> {
  const last = await redis.xrevrange(key, '+', '-', 'COUNT', 1);
  return last[0]?.[0];
}

/** Writes `field` of the run's meta hash (a note beside what the run was started with). */
export async function writeMetaField(
  redis: Redis,
  keys: Keys,
  runId: string,
  field: string,
  value: string,
): Promise<void> {
  await redis.hset(keys.runKey(runId, RunKeyKind.Meta), field, value);
}

/** `field` of the run's meta hash, or null. */
export function readMetaField(
  redis: Redis,
  keys: Keys,
  runId: string,
  field: string,
): Promise<string | null> {
  return redis.hget(keys.runKey(runId, RunKeyKind.Meta), field);
}

/**
 * The field of a run's meta hash where `flujo run` records the job module (an absolute path) that
 * started the run, for the commands it prints.
 */
export const RUN_MODULE_FIELD = 'cliModule';

/** The job module recorded for the run (see {@link RUN_MODULE_FIELD}), or null. */
export function readRunModule(redis: Redis, keys: Keys, runId: string): Promise<string | null> {
  return readMetaField(redis, keys, runId, RUN_MODULE_FIELD);
}
