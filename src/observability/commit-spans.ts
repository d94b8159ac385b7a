/**
 * The spans of what outlives a process, recorded by the process that commits its end, from the
 * run's committed facts: the run itself (`flujo.run`, from its creation to its end), a gate's wait
 * for approval (`flujo.wait.approval`), a tool call's wait for approval
 * (`flujo.wait.tool_approval`) and the backoff between two attempts (`flujo.wait.retry`). A commit
 * happens once (compare-and-set): a redelivered or repeated event commits nothing, so each span is
 * recorded at most once; a process that dies between its commit and the export loses it.
 */
import { runStatus, runSteps, type RunSnapshot, type StepState } from '../machines/kernel.js';
import type { RunEvent } from '../schemas/events.js';
import {
  recordLater,
  recordRunSpan,
  recordWaitSpan,
  tracingEnabled,
  type WaitSpanFacts,
} from './tracing.js';

/** One commit of a run: the snapshot before, the events fed, the snapshot committed. */
export interface CommittedEvents {
  runId: string;
  before: RunSnapshot;
  events: readonly RunEvent[];
  after: RunSnapshot;
}

/** What the spans of a run read from its stored meta. */
export interface RunTraceMeta {
  /** The run's `traceparent`; null for a run started without one. */
  trace: string | null;
  /** The span the run's span is recorded under ('' for none); null when it was recorded at its start. */
  traceCaller: string | null;
  planName: string;
  tenantId: string;
}

const ENDED = new Set(['succeeded', 'failed', 'cancelled']);

/** The time now in ms, as the SDK measures span times (fractions of a ms included). */
const now = (): number => performance.timeOrigin + performance.now();

function stepOf(snapshot: RunSnapshot, stepId: string): StepState | undefined {
  return runSteps(snapshot).find((s) => s.stepId === stepId);
}

/**
 * The wait of a wait step that an event ends (a signal taken, a timer fired, a signal wait timed
 * out), from the step as it was before: from when it started waiting.
 */
function waitStepEnded(
  e: RunEvent,
  before: RunSnapshot,
): Omit<WaitSpanFacts, 'traceparent'> | null {
  if (e.type !== 'step.succeeded' && e.type !== 'step.failed') return null;
  const step = stepOf(before, e.stepId);
  const wait = step?.wait ?? null;
  if (step?.status !== 'WAITING' || wait === null) return null;
  const ids = { stepId: e.stepId, attempt: step.attempt };
  if (wait.signal === null) {
    const attributes = wait.dueAt === null ? {} : { 'flujo.wait.due_at': wait.dueAt };
    return { name: 'flujo.wait.timer', ids, start: wait.since, end: e.at, attributes };
  }
  const outcome = e.type === 'step.succeeded' ? 'taken' : 'timed_out';
  return {
    name: 'flujo.wait.signal',
    ids,
    start: wait.since,
    end: e.at,
    attributes: { 'flujo.wait.signal': wait.signal, 'flujo.wait.outcome': outcome },
  };
}

/** The wait an event ends, from the step as it was before. */
function waitEnded(e: RunEvent, before: RunSnapshot): Omit<WaitSpanFacts, 'traceparent'> | null {
  if (e.type === 'gate.approved' || e.type === 'gate.rejected') {
    const step = stepOf(before, e.stepId);
    if (step?.status !== 'WAITING_APPROVAL') return null;
    const decided = {
      'flujo.wait.decision': e.type === 'gate.approved' ? 'approved' : 'rejected',
      'flujo.wait.by': e.by,
    };
    const call = step.pendingCall;
    if (call !== null) {
      return {
        name: 'flujo.wait.tool_approval',
        ids: { stepId: e.stepId, attempt: step.attempt },
        start: call.at,
        end: e.at,
        attributes: { ...decided, 'flujo.tool': call.tool, 'flujo.tool.call_id': call.callId },
      };
    }
    return {
      name: 'flujo.wait.approval',
      ids: { stepId: e.stepId },
      start: step.updatedAt,
      end: e.at,
      attributes: decided,
    };
  }
  if (e.type === 'retry.due') {
    const step = stepOf(before, e.stepId);
    if (step?.status !== 'FAILED_RETRYABLE') return null;
    const attributes: WaitSpanFacts['attributes'] = { 'flujo.retry.next_attempt': e.attempt };
    if (step.retryAt !== null) attributes['flujo.retry.delay_ms'] = step.retryAt - step.updatedAt;
    if (step.error !== null) attributes['error.type'] = step.error.code;
    return {
      name: 'flujo.wait.retry',
      ids: { stepId: e.stepId, attempt: step.attempt },
      start: step.updatedAt,
      end: e.at,
      attributes,
    };
  }
  return null;
}

/**
 * The function a run host calls after each of its commits: it records the spans of the waits the
 * commit ended and, when the commit ended the run (its first end: a resumed run's later end is
 * not recorded again), the run's span. Costs a check per commit without an SDK.
 */
export function commitSpans(
  meta: (runId: string) => Promise<RunTraceMeta>,
): (commit: CommittedEvents) => void {
  return ({ runId, before, events, after }) => {
    if (!tracingEnabled()) return;
    const waits = events.flatMap((e) => waitEnded(e, before) ?? waitStepEnded(e, before) ?? []);
    const status = runStatus(after);
    const ended = !ENDED.has(runStatus(before)) && ENDED.has(status) && after.context.resumes === 0;
    if (waits.length === 0 && !ended) return;
    // Taken now: the commit that ended the run is the run's last fact.
    const endedAt = Math.max(after.context.updatedAt, now());
    recordLater(
      meta(runId).then((m) => {
        if (m.trace === null) return;
        for (const w of waits) {
          recordWaitSpan({ ...w, traceparent: m.trace, ids: { runId, ...w.ids } });
        }
        if (ended && m.traceCaller !== null) {
          recordRunSpan({
            runId,
            traceparent: m.trace,
            caller: m.traceCaller,
            start: after.context.createdAt,
            end: endedAt,
            status,
            attributes: { 'flujo.plan': m.planName, 'flujo.tenant_id': m.tenantId },
          });
        }
      }),
    );
  };
}
