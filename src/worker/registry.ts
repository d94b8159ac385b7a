/**
 * A worker's registry of the units it is running and what it has done since it started: in this
 * process only (an `@xstate/store` store), for people and probes watching the worker. Nothing
 * durable is kept here and nothing decides on it: which unit may run is still only the unit's
 * guard against the run's snapshot.
 */
import { createStore } from '@xstate/store';
import type { WorkerIdentity } from '../persistence/unit-notes.js';

/** A unit of work a worker is running. */
export interface RunningUnit {
  /** The queue job that runs it (a job may run several units one after the other). */
  jobId: string;
  runId: string;
  stepId: string;
  /** The attempt (1 for the first). */
  attempt: number;
  /** For a turn of a granular agent step: the turn (0-based); else null. */
  turn: number | null;
  kind: 'step' | 'turn';
  /** When the worker started it, epoch ms. */
  since: number;
}

/** What a worker's units came to since it started. */
export interface WorkerCounters {
  /**
   * Units that ended: committed (a success, a failed attempt that is retried or final, a pause
   * for approval, a turn), found done already by their guard, or stopped by a budget.
   */
  done: number;
  /**
   * Units whose attempt failed (a `step.failed` committed: also counted in `done`) or that threw
   * (Redis unavailable, a lost race past its limit: the queue hands the job out again).
   */
  failed: number;
  /** Units handed back because another worker holds a lease on one of their tool calls. */
  busy: number;
}

/** A snapshot of a worker's registry, as `worker.status()` returns it (plain JSON). */
export interface WorkerStatus {
  /** Who the worker is: host, process id, and an id unique per worker instance. */
  worker: WorkerIdentity;
  /** Units it runs at once at most. */
  concurrency: number;
  /** When it was created, epoch ms. */
  startedAt: number;
  /** True once `close()` was called: it takes no more units. */
  closing: boolean;
  /** The units it is running, oldest first. */
  running: RunningUnit[];
  counters: WorkerCounters;
}

/**
 * How a unit ended, as the registry counts it: `done`, `attemptFailed` (done, with a failed
 * attempt committed), `busy` (handed back), or `threw`.
 */
export type UnitEnd = 'done' | 'attemptFailed' | 'busy' | 'threw';

/** Creates a worker's registry (see {@link WorkerStatus}). */
export function createWorkerRegistry(init: {
  worker: WorkerIdentity;
  concurrency: number;
  startedAt: number;
}) {
  const context: WorkerStatus = {
    ...init,
    closing: false,
    running: [],
    counters: { done: 0, failed: 0, busy: 0 },
  };
  return createStore({
    context,
    on: {
      /** A job started a unit (a job that goes on with its next unit replaces its entry). */
      unitStarted: (ctx, event: { unit: RunningUnit }) => ({
        ...ctx,
        running: [...ctx.running.filter((u) => u.jobId !== event.unit.jobId), event.unit],
      }),
      /** A job's unit ended (see {@link UnitEnd}). */
      unitEnded: (ctx, event: { jobId: string; end: UnitEnd }) => {
        const { done, failed, busy } = ctx.counters;
        const { end } = event;
        return {
          ...ctx,
          running: ctx.running.filter((u) => u.jobId !== event.jobId),
          counters: {
            done: done + (end === 'done' || end === 'attemptFailed' ? 1 : 0),
            failed: failed + (end === 'attemptFailed' || end === 'threw' ? 1 : 0),
            busy: busy + (end === 'busy' ? 1 : 0),
          },
        };
      },
      closing: (ctx) => ({ ...ctx, closing: true }),
    },
  });
}

/** A worker's registry store. */
export type WorkerRegistry = ReturnType<typeof createWorkerRegistry>;
