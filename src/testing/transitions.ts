/**
 * Readable transition traces for snapshot tests: a plan and a list of run events in, one stable
 * line of text per transition out (the event, the run's status, each step that moved, each action
 * the kernel planned), computed by the pure kernel with no Redis, no worker and no clock.
 *
 * ```ts
 * const t = traceTransitions(plan, [runEvents.ok('draft'), runEvents.approve('review')]);
 * expect(t.text).toMatchInlineSnapshot();
 * ```
 */
import {
  advanceRun,
  runSteps,
  startRun,
  type RunSnapshot,
  type RunTransition,
} from '../machines/kernel.js';
import type { PlannedAction } from '../machines/types.js';
import { parsePlan } from '../plan/parse-plan.js';
import type { Plan, PlanInput } from '../plan/schema.js';
import type { JsonValue } from '../internal/json.js';
import type { RunEvent } from '../schemas/events.js';

/** The clock of {@link runEvents} and of a trace's start: a fixed epoch, so traces are stable. */
export const TRACE_T0 = 1_700_000_000_000;

/** Options of {@link traceTransitions}. */
export interface TraceTransitionsOptions {
  /** The run id given to the kernel (default `'r1'`). It appears in no line of the text. */
  runId?: string;
  /** The run's creation time, epoch ms (default {@link TRACE_T0}). */
  at?: number;
}

/** What {@link traceTransitions} returns. */
export interface TransitionTrace {
  /**
   * The lines joined, between a leading and a trailing newline, so that an inline snapshot of it
   * reads one transition per line.
   */
  text: string;
  /**
   * One line for the start, one per event, and a last `end:` line with every step's final status.
   * A line reads `<event> ⇒ <run status>[ (ignored)][ | <step>:<from>→<to> …][ | <planned>, …]`,
   * where a planned action is `execute s#2`, `retry s#2 in 1000ms`, `ask approval s` or
   * `abort s#1`; `(ignored)` marks an event the kernel did not accept.
   */
  lines: string[];
  /** Every transition, the start's first. */
  transitions: RunTransition[];
  /** The run's snapshot after the last event. */
  snapshot: RunSnapshot;
}

/**
 * Runs `events` through the kernel from the plan's start and describes each transition in a stable
 * line of text. `plan` is a parsed plan or plan data (parsed here, with the same errors as
 * `parsePlan`); an event the kernel refuses throws the kernel's error, naming the field.
 */
export function traceTransitions(
  plan: Plan | PlanInput,
  events: readonly RunEvent[],
  options: TraceTransitionsOptions = {},
): TransitionTrace {
  const parsed = parsePlan(plan);
  let t = startRun(parsed, { runId: options.runId ?? 'r1', at: options.at ?? TRACE_T0 });
  const transitions = [t];
  const lines = [transitionLine(null, t)];
  for (const event of events) {
    t = advanceRun(t.snapshot, event);
    transitions.push(t);
    lines.push(transitionLine(event, t));
  }
  const finalStates = runSteps(t.snapshot)
    .map((s) => `${s.stepId}=${s.status}`)
    .join(' ');
  lines.push(`end: ${finalStates}`);
  return { text: `\n${lines.join('\n')}\n`, lines, transitions, snapshot: t.snapshot };
}

/**
 * One transition as a line of text (see {@link TransitionTrace.lines}); `event` is `null` for the
 * run's start.
 */
export function transitionLine(event: RunEvent | null, t: RunTransition): string {
  const changes = t.changes.map((c) => `${c.stepId}:${c.from}→${c.to}`).join(' ');
  const planned = t.planned.map(plannedText).join(', ');
  return [
    `${eventLabel(event)} ⇒ ${t.status}${t.accepted ? '' : ' (ignored)'}`,
    changes === '' ? '' : ` | ${changes}`,
    planned === '' ? '' : ` | ${planned}`,
  ].join('');
}

function eventLabel(event: RunEvent | null): string {
  if (event === null) return 'start';
  const target = 'stepId' in event ? ` ${event.stepId}` : '';
  const attempt = 'attempt' in event && event.attempt !== undefined ? `#${event.attempt}` : '';
  return `${event.type}${target}${attempt}`;
}

function plannedText(a: PlannedAction): string {
  switch (a.type) {
    case 'step.execute':
      return `execute ${a.stepId}#${a.attempt}`;
    case 'step.scheduleRetry':
      return `retry ${a.stepId}#${a.attempt} in ${a.delayMs}ms`;
    case 'step.requestApproval':
      return `ask approval ${a.stepId}`;
    case 'step.abort':
      return `abort ${a.stepId}#${a.attempt}`;
    case 'step.wait':
      return `wait ${a.stepId}#${a.attempt}${a.dueAt === null ? '' : ` until ${a.dueAt}`}`;
  }
}

/**
 * Builders of the run events a worker or a person feeds the kernel, each at a fixed time after
 * {@link TRACE_T0} so that traces (and snapshots holding times) are stable. Pass `at` to place an
 * event elsewhere.
 */
export const runEvents = {
  /** A step attempt began executing. */
  start: (stepId: string, attempt = 1, at = TRACE_T0 + 500): RunEvent => ({
    type: 'step.started',
    stepId,
    attempt,
    at,
  }),
  /** A step attempt succeeded with `output` (default `'<stepId> done'`). */
  ok: (
    stepId: string,
    attempt = 1,
    output: JsonValue = `${stepId} done`,
    at = TRACE_T0 + 1000,
  ): RunEvent => ({ type: 'step.succeeded', stepId, attempt, output, at }),
  /**
   * A step attempt failed: retryable (a timeout, retried by the plan's retry policy) or final (a
   * policy denial).
   */
  fail: (stepId: string, attempt = 1, retryable = true, at = TRACE_T0 + 2000): RunEvent => ({
    type: 'step.failed',
    stepId,
    attempt,
    error: {
      name: retryable ? 'TimeoutError' : 'PolicyDeniedError',
      code: retryable ? 'timeout' : 'policy_denied',
      message: retryable ? 'upstream timed out' : 'policy denied',
      retryable,
    },
    jitterSeed: 1,
    at,
  }),
  /** A retry's backoff ran out: attempt `attempt` may start. */
  due: (stepId: string, attempt: number, at = TRACE_T0 + 5000): RunEvent => ({
    type: 'retry.due',
    stepId,
    attempt,
    at,
  }),
  /** A person approved the step's gate. */
  approve: (stepId: string, by = 'ana', at = TRACE_T0 + 3000): RunEvent => ({
    type: 'gate.approved',
    stepId,
    by,
    comment: 'looks right',
    at,
  }),
  /** A person rejected the step's gate. */
  reject: (stepId: string, by = 'bo', at = TRACE_T0 + 3000): RunEvent => ({
    type: 'gate.rejected',
    stepId,
    by,
    comment: 'wrong recipient',
    at,
  }),
  /** A person skipped the step. */
  skip: (stepId: string, reason = 'not needed', at = TRACE_T0 + 4000): RunEvent => ({
    type: 'step.skipped',
    stepId,
    reason,
    at,
  }),
  /** A person cancelled the run. */
  cancel: (at = TRACE_T0 + 6000): RunEvent => ({
    type: 'run.cancelled',
    by: 'ops',
    reason: 'deploy',
    at,
  }),
  /** The run hit a budget and stopped. */
  stop: (at = TRACE_T0 + 7000): RunEvent => ({
    type: 'run.stopped',
    reason: 'budget_exceeded',
    detail: { budget: 'maxSteps', limit: 3 },
    at,
  }),
  /** A stopped or failed run was resumed. */
  resume: (at = TRACE_T0 + 8000): RunEvent => ({ type: 'run.resumed', by: 'ops', at }),
};
