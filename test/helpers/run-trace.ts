import {
  advanceRun,
  runSteps,
  startRun,
  type RunSnapshot,
  type RunTransition,
} from '../../src/machines/kernel.js';
import type { PlannedAction } from '../../src/machines/types.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import type { Plan, PlanInput } from '../../src/plan/schema.js';
import type { RunEvent } from '../../src/schemas/events.js';

/** A plan from a few step fields; retries without jitter so traces are easy to read. */
export function planOf(steps: PlanInput['steps'], name = 'trace'): Plan {
  return parsePlan({
    name,
    defaults: { retry: { maxAttempts: 3, initialDelayMs: 1000, backoffCoefficient: 2, jitter: 0 } },
    steps,
  });
}

export const T0 = 1_700_000_000_000;

/** Builders for run events at a fixed clock, so traces are stable. */
export const e = {
  start: (stepId: string, attempt = 1): RunEvent => ({
    type: 'step.started',
    stepId,
    attempt,
    at: T0 + 500,
  }),
  ok: (stepId: string, attempt = 1, output: unknown = `${stepId} done`): RunEvent => ({
    type: 'step.succeeded',
    stepId,
    attempt,
    output: output as never,
    at: T0 + 1000,
  }),
  fail: (stepId: string, attempt = 1, retryable = true): RunEvent => ({
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
    at: T0 + 2000,
  }),
  due: (stepId: string, attempt: number): RunEvent => ({
    type: 'retry.due',
    stepId,
    attempt,
    at: T0 + 5000,
  }),
  approve: (stepId: string): RunEvent => ({
    type: 'gate.approved',
    stepId,
    by: 'ana',
    comment: 'looks right',
    at: T0 + 3000,
  }),
  reject: (stepId: string): RunEvent => ({
    type: 'gate.rejected',
    stepId,
    by: 'bo',
    comment: 'wrong recipient',
    at: T0 + 3000,
  }),
  skip: (stepId: string): RunEvent => ({
    type: 'step.skipped',
    stepId,
    reason: 'not needed',
    at: T0 + 4000,
  }),
  cancel: (): RunEvent => ({ type: 'run.cancelled', by: 'ops', reason: 'deploy', at: T0 + 6000 }),
  stop: (): RunEvent => ({
    type: 'run.stopped',
    reason: 'budget_exceeded',
    detail: { budget: 'maxSteps', limit: 3 },
    at: T0 + 7000,
  }),
  resume: (): RunEvent => ({ type: 'run.resumed', by: 'ops', at: T0 + 8000 }),
};

function label(event: RunEvent | null): string {
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
  }
}

/** One line per event: the event, the run's status, each step change, each planned action. */
export function traceLine(event: RunEvent | null, t: RunTransition): string {
  const changes = t.changes.map((c) => `${c.stepId}:${c.from}→${c.to}`).join(' ');
  const planned = t.planned.map(plannedText).join(', ');
  return [
    `${label(event)} ⇒ ${t.status}${t.accepted ? '' : ' (ignored)'}`,
    changes === '' ? '' : ` | ${changes}`,
    planned === '' ? '' : ` | ${planned}`,
  ].join('');
}

/** Runs `events` through the kernel from the start and returns the trace and the last snapshot. */
export function trace(
  plan: Plan,
  events: RunEvent[],
): { text: string; snapshot: RunSnapshot; last: RunTransition } {
  let t = startRun(plan, { runId: 'r1', at: T0 });
  const lines = [traceLine(null, t)];
  for (const event of events) {
    t = advanceRun(t.snapshot, event);
    lines.push(traceLine(event, t));
  }
  const finalStates = runSteps(t.snapshot)
    .map((s) => `${s.stepId}=${s.status}`)
    .join(' ');
  lines.push(`end: ${finalStates}`);
  return { text: `\n${lines.join('\n')}\n`, snapshot: t.snapshot, last: t };
}
