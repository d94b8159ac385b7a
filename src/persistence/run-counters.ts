/**
 * A run's counters: one hash per run (expired with the run's other keys) counting what budgets
 * bound across attempts and workers: tool calls of the run and of each step, and when each step's
 * first attempt started (the start of a step's own `maxWallClockMs`). A step's own counts start
 * again when a resume or a skip reopens the step; the run's never do.
 */
import type { ChainableCommander, Redis } from 'ioredis';
import type { Keys } from './keys.js';

/** Counters of the runs of one prefix. */
export interface RunCounters {
  /**
   * Counts a tool call that will really run, for the run and for its step, in one round trip;
   * returns both counts including this call.
   */
  countToolCall(runId: string, stepId: string): Promise<{ run: number; step: number }>;
  /**
   * When the step's first attempt started: `now` noted unless a start is noted already (one
   * round trip), and the noted start returned.
   */
  stepStartedAt(runId: string, stepId: string, now: number): Promise<number>;
  /**
   * Forgets what the steps' own budgets counted (their tool calls, when their first attempt
   * started), so that a step reopened by a resume or a skip starts a fresh step budget; the run's
   * counts stay. One round trip; nothing for no step.
   */
  resetSteps(runId: string, stepIds: readonly string[]): Promise<void>;
}

/** The field of a run's counters that counts `what` for one step. */
const stepCounter = (stepId: string, what: string): string => `step:${stepId}:${what}`;
/** What is counted for each step (see {@link RunCounters}). */
const STEP_COUNTERS = ['toolCalls', 'startedAt'] as const;

/** The replies of a pipeline, in order; throws its first error. */
async function repliesOf(pipeline: ChainableCommander): Promise<unknown[]> {
  const replies = await pipeline.exec();
  if (replies === null) throw new Error('a Redis pipeline was discarded');
  return replies.map(([error, value]) => {
    if (error !== null) throw error;
    return value;
  });
}

/** Creates the {@link RunCounters} of `keys`' prefix on `redis`. */
export function createRunCounters(redis: Redis, keys: Keys): RunCounters {
  return {
    async countToolCall(runId, stepId) {
      const key = keys.counters(runId);
      const [run, step] = await repliesOf(
        redis
          .pipeline()
          .hincrby(key, 'toolCalls', 1)
          .hincrby(key, stepCounter(stepId, 'toolCalls'), 1),
      );
      return { run: run as number, step: step as number };
    },
    async stepStartedAt(runId, stepId, now) {
      const key = keys.counters(runId);
      const field = stepCounter(stepId, 'startedAt');
      const [, read] = await repliesOf(
        redis.pipeline().hsetnx(key, field, String(now)).hget(key, field),
      );
      return typeof read === 'string' ? Number(read) : now;
    },
    async resetSteps(runId, stepIds) {
      if (stepIds.length === 0) return;
      const fields = stepIds.flatMap((id) => STEP_COUNTERS.map((what) => stepCounter(id, what)));
      await redis.hdel(keys.counters(runId), ...fields);
    },
  };
}
