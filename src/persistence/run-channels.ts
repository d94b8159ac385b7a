/**
 * What a run says live, beside its history: aborts of running attempts (to every worker), pieces
 * of a streaming reply, and the progress operators report (the latest value per step is kept in a
 * hash, expired with the run). Nothing here is part of the run's history.
 */
import type { Redis } from 'ioredis';
import { RunKeyKind, type Keys } from './keys.js';

/** The pub/sub channels and progress notes of one prefix. */
export interface RunChannels {
  /** The channel on which aborts of running attempts are announced. */
  readonly abortChannel: string;
  /** The channel on which a run's streamed reply text is published. */
  chunkChannel(runId: string): string;
  /** The channel (and hash) of a run's progress reports. */
  progressChannel(runId: string): string;
  /** Announces `message` (see `abortMessage`) on the abort channel. */
  publishAbort(message: string): Promise<void>;
  /** Publishes a piece of a streaming reply (best effort: a lost one is not retried). */
  publishChunk(runId: string, message: string): Promise<void>;
  /** Overwrites the step's latest progress and publishes it, in one transaction. */
  publishProgress(runId: string, stepId: string, message: string): Promise<void>;
  /** The latest progress message of each step of the run, by step id. */
  readProgress(runId: string): Promise<Record<string, string>>;
}

/** Creates the {@link RunChannels} of `keys`' prefix on `redis`. */
export function createRunChannels(redis: Redis, keys: Keys): RunChannels {
  const abortChannel = `${keys.prefix}:abort`;
  const chunkChannel = (runId: string) => keys.runKey(runId, RunKeyKind.Chunks);
  return {
    abortChannel,
    chunkChannel,
    progressChannel: (runId) => keys.progress(runId),
    async publishAbort(message) {
      await redis.publish(abortChannel, message);
    },
    async publishChunk(runId, message) {
      await redis.publish(chunkChannel(runId), message);
    },
    async publishProgress(runId, stepId, message) {
      const key = keys.progress(runId);
      await redis.multi().hset(key, stepId, message).publish(key, message).exec();
    },
    readProgress: (runId) => redis.hgetall(keys.progress(runId)),
  };
}
