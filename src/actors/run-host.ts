import { InvariantError, SnapshotConflictError } from '../errors.js';
import type { JsonValue } from '../internal/json.js';
import {
  advanceRun,
  runSteps,
  startRun,
  type RunSnapshot,
  type RunTransition,
} from '../machines/kernel.js';
import type { RunStatus } from '../machines/types.js';
import type { Plan } from '../plan/schema.js';
import type { SnapshotEnvelope } from '../persistence/codec.js';
import type { RunEventRecord, SnapshotStore } from '../persistence/snapshot-store.js';
import type { RunEvent } from '../schemas/events.js';

/** What a run's stream says when it ends: what it produced, and where and why it stopped. */
export interface RunSummary {
  status: RunStatus;
  /** Outputs of the steps that succeeded, by step id. */
  produced: Record<string, JsonValue>;
  /** The first step (plan order) that failed finally, if any. */
  blockedStep: string | null;
  /** A reason code: `budget_exceeded`, `approval_rejected`, `tool_outcome_unknown`, … */
  reason: string | null;
  detail: JsonValue | null;
  attempts: number;
  at: number;
}

/** The summary of a run as its snapshot stands. */
export function summarize(snapshot: RunSnapshot, status: RunStatus, at: number): RunSummary {
  const steps = runSteps(snapshot);
  const produced: Record<string, JsonValue> = {};
  for (const s of steps)
    if (s.status === 'SUCCEEDED' && s.output !== null) produced[s.stepId] = s.output;
  const failed = steps.find((s) => s.status === 'FAILED_FINAL');
  const ctx = snapshot.context;
  let reason: string | null = null;
  let detail: JsonValue | null = null;
  if (ctx.stop !== null) {
    reason = ctx.stop.reason;
    detail = ctx.stop.detail;
  } else if (ctx.cancel !== null) {
    reason = 'run_cancelled';
    detail = ctx.cancel.reason;
  } else if (failed !== undefined) {
    // The error's own code says more than "non_retryable_error" (e.g. tool_outcome_unknown).
    reason =
      failed.reason === 'non_retryable_error' && failed.error !== null
        ? failed.error.code
        : failed.reason;
    detail = failed.error === null ? null : (failed.error as unknown as JsonValue);
  }
  return {
    status,
    produced,
    blockedStep: failed?.stepId ?? null,
    reason,
    detail,
    attempts: steps.reduce((n, s) => n + s.attempt, 0),
    at,
  };
}

const ENDED: readonly RunStatus[] = ['succeeded', 'failed', 'cancelled'];

/**
 * The events one commit appends to the run's stream: the event itself, each step change, the
 * run's status change, and a `run.finished` summary when the run ends.
 */
export function factsOf(
  event: RunEvent | { type: 'run.created'; at: number; [k: string]: unknown },
  before: RunStatus | null,
  t: RunTransition,
): RunEventRecord[] {
  const at = event.at;
  const facts: RunEventRecord[] = [event];
  for (const c of t.changes) facts.push({ type: 'step.changed', ...c, at });
  if (before !== t.status) {
    facts.push({ type: 'run.status', from: before, to: t.status, at });
    if (ENDED.includes(t.status)) {
      facts.push({ type: 'run.finished', ...summarize(t.snapshot, t.status, at) });
    }
  }
  return facts;
}

/** The result of feeding one event to a stored run. */
export interface AppliedEvent {
  envelope: SnapshotEnvelope<RunSnapshot>;
  transition: RunTransition;
  /** False when the event changed nothing, so nothing was written. */
  committed: boolean;
}

/** Options of {@link createRunHost}. */
export interface RunHostOptions {
  store: SnapshotStore<RunSnapshot>;
  /**
   * How many lost compare-and-set races to absorb (reload, decide again) before giving up.
   * @defaultValue 50
   */
  maxConflicts?: number;
}

/** Creates runs and feeds them events: load → decide (pure) → commit with compare-and-set. */
export interface RunHost {
  /** Creates a run from a parsed plan; `meta` is stored with it in the same transaction. */
  create(
    runId: string,
    plan: Plan,
    at: number,
    meta: Readonly<Record<string, string>>,
  ): Promise<AppliedEvent>;
  /**
   * Feeds `event` to the run. On a lost race, reloads and decides again (the event is a fact, so
   * deciding again is safe); an event the new state no longer accepts is dropped.
   */
  apply(
    runId: string,
    event: RunEvent,
    loaded?: SnapshotEnvelope<RunSnapshot>,
  ): Promise<AppliedEvent>;
}

/** Creates a {@link RunHost} over a snapshot store. */
export function createRunHost({ store, maxConflicts = 50 }: RunHostOptions): RunHost {
  return {
    async create(runId, plan, at, meta) {
      const transition = startRun(plan, { runId, at });
      const created = { type: 'run.created', runId, plan: plan.name, at } as const;
      const envelope = await store.create(
        runId,
        transition.snapshot,
        factsOf(created, null, transition),
        meta,
      );
      return { envelope, transition, committed: true };
    },

    async apply(runId, event, loaded) {
      let envelope = loaded ?? (await store.load(runId));
      for (let conflicts = 0; ; conflicts++) {
        const before = advanceRun(envelope.snapshot, event);
        if (!before.accepted) return { envelope, transition: before, committed: false };
        const status = statusBefore(envelope.snapshot);
        try {
          const next = await store.commit(
            runId,
            envelope.version,
            before.snapshot,
            factsOf(event, status, before),
          );
          return { envelope: next, transition: before, committed: true };
        } catch (error) {
          if (!(error instanceof SnapshotConflictError) || conflicts >= maxConflicts) throw error;
          envelope = await store.load(runId);
        }
      }
    },
  };
}

function statusBefore(snapshot: RunSnapshot): RunStatus {
  const value = snapshot.value;
  if (
    value === 'running' ||
    value === 'waiting' ||
    value === 'succeeded' ||
    value === 'failed' ||
    value === 'cancelled'
  ) {
    return value;
  }
  throw new InvariantError(`run snapshot in unknown state "${value}"`);
}
