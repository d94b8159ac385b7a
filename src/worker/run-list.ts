import { InputValidationError, type ValidationIssue as Issue } from '../errors.js';
import { summarize } from '../actors/run-host.js';
import { runStatus, runSteps, type RunSnapshot, type StepState } from '../machines/kernel.js';
import { RunStatus } from '../machines/types.js';
import type { RunIndexEntry } from '../persistence/run-index.js';
import type { RuntimeCore } from '../actors/core.js';

/** Which runs `listRuns` returns. */
export interface RunListFilter {
  /** Only runs in this status (or one of these). @defaultValue any */
  status?: RunStatus | readonly RunStatus[];
  /** Only runs of the plan with this name. @defaultValue any */
  plan?: string;
  /** Only runs of this tenant. @defaultValue any */
  tenantId?: string;
  /** Only runs started at or after this time (epoch ms or a Date). @defaultValue no bound */
  since?: number | Date;
  /** Only runs started at or before this time (epoch ms or a Date). @defaultValue no bound */
  until?: number | Date;
  /** At most this many runs, 1 to 1000. @defaultValue 50 */
  limit?: number;
}

/** The step that waits (for a person first, else for a signal or a time) and what for. */
function waitingOf(steps: readonly StepState[]): Pick<RunListEntry, 'waitingStep' | 'waitsFor'> {
  const gate = steps.find((s) => s.status === 'WAITING_APPROVAL');
  if (gate !== undefined) return { waitingStep: gate.stepId, waitsFor: 'approval' };
  const wait = steps.find((s) => s.status === 'WAITING');
  if (wait === undefined) return { waitingStep: null, waitsFor: null };
  const w = wait.wait ?? null;
  if (w?.child != null) return { waitingStep: wait.stepId, waitsFor: `child run ${w.child}` };
  const what =
    w?.signal != null
      ? `signal "${w.signal}"`
      : `timer until ${w?.dueAt == null ? '?' : new Date(w.dueAt).toISOString()}`;
  return { waitingStep: wait.stepId, waitsFor: what };
}

/** One run of the list. */
export interface RunListEntry {
  runId: string;
  planName: string;
  tenantId: string;
  status: RunStatus;
  createdAt: number;
  /** When the run ended; null while it has not. */
  endedAt: number | null;
  /** From its start to its end, or to now while it has not ended. */
  durationMs: number;
  /** The step that waits for a person, or else for a signal or a time, if one does. */
  waitingStep: string | null;
  /**
   * What that step waits for: `approval`, `signal "<name>"`, or `timer until <ISO time>`; null
   * when no step waits. Absent in entries of runs that ended.
   */
  waitsFor?: string | null;
  /** While the run works: the first step that is running or due. */
  currentStep: string | null;
  /** A failed run: the first step (plan order) that failed finally, if one did. */
  blockedStep: string | null;
  /** A failed run: why, as a code (`tool_input_invalid`, `budget_exceeded`, …). */
  reason: string | null;
  /** A child run (started by a `run` step): its parent run; null for a run without one. */
  parentRunId?: string | null;
}

const ENDED: readonly string[] = [RunStatus.succeeded, RunStatus.failed, RunStatus.cancelled];
const STATUSES = Object.values(RunStatus) as readonly string[];
/** An entry whose run does not exist is removed only once it is this old: its run may be being created. */
const CREATING_MS = 60_000;

interface Checked {
  statuses: readonly string[] | null;
  since: number;
  until: number;
  limit: number;
}

function timeOf(value: unknown, field: string, issues: Issue[]): number | undefined {
  if (value === undefined) return undefined;
  const ms = value instanceof Date ? value.getTime() : value;
  if (typeof ms !== 'number' || !Number.isFinite(ms)) {
    issues.push({ path: field, message: 'must be epoch milliseconds or a valid Date' });
    return undefined;
  }
  return ms;
}

/** Checks a filter before anything is read; throws `InputValidationError` naming each bad field. */
export function checkRunListFilter(filter: RunListFilter): Checked {
  const issues: Issue[] = [];
  if (typeof filter !== 'object' || filter === null) {
    throw new InputValidationError('run list filter', [
      { path: 'filter', message: 'must be an object, e.g. { status: "failed", limit: 20 }' },
    ]);
  }
  let statuses: readonly string[] | null = null;
  if (filter.status !== undefined) {
    statuses = typeof filter.status === 'string' ? [filter.status] : [...filter.status];
    const bad = statuses.filter((s) => !STATUSES.includes(s));
    if (bad.length > 0 || statuses.length === 0) {
      issues.push({
        path: 'status',
        message: `must be one of ${STATUSES.join(', ')}${bad.length > 0 ? `; got "${bad.join('", "')}"` : ''}`,
      });
    }
  }
  for (const field of ['plan', 'tenantId'] as const) {
    const v = filter[field];
    if (v !== undefined && (typeof v !== 'string' || v === '')) {
      issues.push({ path: field, message: 'must be a non-empty string' });
    }
  }
  const since = timeOf(filter.since, 'since', issues) ?? -Infinity;
  const until = timeOf(filter.until, 'until', issues) ?? Infinity;
  if (since > until) issues.push({ path: 'since', message: 'must not be after until' });
  const limit = filter.limit ?? 50;
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > 1000) {
    issues.push({
      path: 'limit',
      message: `must be an integer from 1 to 1000, got ${String(limit)}`,
    });
  }
  if (issues.length > 0) throw new InputValidationError('run list filter', issues);
  return { statuses, since, until, limit };
}

/**
 * The runs of the runtime's prefix, newest first, as `filter` asks. A run that ended is shown from
 * the index (and one read that says it still exists); a run that has not ended (by the index) is
 * read, so its status is the current one. Entries of runs that no longer exist are removed on the
 * way; with `finishedRunsMs`, entries of runs that ended longer ago than that are trimmed first,
 * but those of failed runs only once they failed longer ago than `failedRunsMs` (the runtime's
 * `retention.failedRunsMs`), and never when it is null: failed runs are kept.
 */
export async function listRuns(
  core: RuntimeCore,
  filter: RunListFilter,
  finishedRunsMs: number | undefined,
  failedRunsMs: number | null = core.stores.retention.failedRunsMs,
): Promise<RunListEntry[]> {
  const { statuses, since, until, limit } = checkRunListFilter(filter);
  const now = core.clock();
  if (finishedRunsMs !== undefined) {
    await core.stores.runs.trim({
      finished: now - finishedRunsMs,
      failed: failedRunsMs === null ? null : now - failedRunsMs,
    });
  }
  const out: RunListEntry[] = [];
  const batch = Math.max(50, limit * 2);
  for (let offset = 0; out.length < limit;) {
    const page = await core.stores.runs.page(since, until, offset, batch);
    if (page.length === 0) break;
    offset += page.length;
    const wanted = page.filter(
      (e) =>
        (filter.plan === undefined || e.planName === filter.plan) &&
        (filter.tenantId === undefined || e.tenantId === filter.tenantId) &&
        (e.end === null || statuses === null || statuses.includes(e.end.status)),
    );
    const rows = await Promise.all(wanted.map((e) => current(core, e, now)));
    const gone = wanted.filter((e, i) => rows[i] === null && e.createdAt < now - CREATING_MS);
    if (gone.length > 0) {
      await core.stores.runs.remove(gone.map((e) => e.runId));
      offset -= gone.length;
    }
    for (const row of rows) {
      if (row === null || (statuses !== null && !statuses.includes(row.status))) continue;
      out.push(row);
      if (out.length === limit) break;
    }
    if (page.length < batch) break;
  }
  return out;
}

/** A run as the list shows it: from the index when it ended, else from its snapshot. */
async function current(
  core: RuntimeCore,
  e: RunIndexEntry,
  now: number,
): Promise<RunListEntry | null> {
  const base = {
    runId: e.runId,
    planName: e.planName,
    tenantId: e.tenantId,
    createdAt: e.createdAt,
    parentRunId: e.parentRunId ?? null,
  };
  if (e.end !== null) {
    let failure = { blockedStep: null as string | null, reason: null as string | null };
    if (e.end.status === RunStatus.failed) {
      // A failed run says where and why: its snapshot is read (without its outputs).
      const env = await core.stores.store.tryLoad(e.runId, { outputs: false });
      if (env === null) return null;
      failure = failureOf(env.snapshot);
    } else if ((await core.stores.store.version(e.runId)) === null) {
      // One small read: the run's keys may have expired since it ended (retention).
      return null;
    }
    return {
      ...base,
      status: e.end.status as RunStatus,
      endedAt: e.end.at,
      durationMs: e.end.at - e.createdAt,
      waitingStep: null,
      currentStep: null,
      ...failure,
    };
  }
  const env = await core.stores.store.tryLoad(e.runId);
  if (env === null) return null;
  const status = runStatus(env.snapshot);
  const ended = ENDED.includes(status);
  // Ended without its end noted (cancelled, or its worker died after the commit): noted now.
  if (ended) await core.stores.runs.ended(e.runId, status, env.updatedAt);
  const steps = runSteps(env.snapshot);
  const endedAt = ended ? env.updatedAt : null;
  return {
    ...base,
    createdAt: e.createdAt || env.snapshot.context.createdAt,
    status,
    endedAt,
    durationMs: (endedAt ?? now) - (e.createdAt || env.snapshot.context.createdAt),
    ...waitingOf(steps),
    currentStep: ended
      ? null
      : (steps.find(
          (s) => s.status === 'RUNNING' || s.status === 'READY' || s.status === 'FAILED_RETRYABLE',
        )?.stepId ?? null),
    ...(status === RunStatus.failed
      ? failureOf(env.snapshot)
      : { blockedStep: null, reason: null }),
  };
}

/** Where and why a failed run stopped, as its summary says. */
function failureOf(snapshot: RunSnapshot): { blockedStep: string | null; reason: string | null } {
  const { blockedStep, reason } = summarize(snapshot, RunStatus.failed, 0);
  return { blockedStep, reason };
}
