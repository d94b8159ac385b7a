/**
 * Wait steps and signals in the pure core: the plan schema of a wait step, and what the machines
 * do with `wait.started` and `signal.taken` (the per-name cursor moves once per signal; a signal
 * is taken by one wait only), and the timer job a WAITING step's snapshot asks for.
 */
import { describe, expect, it } from 'vitest';
import { dueJobs, timerJobId } from '../../src/actors/jobs.js';
import { PlanValidationError } from '../../src/errors.js';
import { advanceRun, runStatus, runSteps, startRun } from '../../src/machines/kernel.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import type { RunEvent } from '../../src/schemas/events.js';

const T0 = 1_800_000_000_000;

const plan = parsePlan({
  name: 'waits',
  steps: [
    { id: 'w1', kind: 'wait', for: { signal: 'go' } },
    { id: 'w2', kind: 'wait', for: { signal: 'go' } },
    { id: 't', kind: 'wait', for: { durationMs: 5000 } },
  ],
});

function problems(steps: unknown[]): string[] {
  try {
    parsePlan({ name: 'p', steps });
  } catch (error) {
    if (error instanceof PlanValidationError)
      return error.issues.map((i) => `${i.path}: ${i.message}`);
    throw error;
  }
  return [];
}

describe('the wait step in a plan', () => {
  it('takes a signal, a duration or a time, and a timeout for a signal wait', () => {
    expect(
      problems([
        { id: 'a', kind: 'wait', for: { signal: 'approve-order' }, timeoutMs: 60_000 },
        { id: 'b', kind: 'wait', for: { durationMs: 60_000 } },
        { id: 'c', kind: 'wait', for: { until: '2026-12-01T09:00:00Z' } },
      ]),
    ).toEqual([]);
  });

  it('refuses a bad `for`, naming the field and the fix', () => {
    const fix = 'give exactly one of { signal: "<name>" }, { durationMs: <ms> } or { until:';
    const found = problems([
      { id: 'a', kind: 'wait', for: {} },
      { id: 'b', kind: 'wait', for: { signal: 'x', until: '2026-12-01T09:00:00Z' } },
      { id: 'c', kind: 'wait', for: { durationMs: 0 } },
      { id: 'd', kind: 'wait', for: { until: '1 Dec' } },
      { id: 'e', kind: 'wait', for: { signal: 'has space' } },
      { id: 'f', kind: 'wait', for: { durationMs: 10 }, timeoutMs: 5 },
      { id: 'g', kind: 'wait' },
      { id: 'h', kind: 'wait', for: 'go' },
    ]);
    expect(found.find((p) => p.startsWith('steps[0].for: '))).toContain(fix);
    expect(found.find((p) => p.startsWith('steps[1].for: '))).toContain(fix);
    expect(found.some((p) => p.startsWith('steps[2].for.durationMs: '))).toBe(true);
    expect(found).toContain(
      'steps[3].for.until: until "1 Dec" is not a time: write an ISO 8601 time with its zone, e.g. "2026-12-01T09:00:00Z"',
    );
    expect(found.find((p) => p.startsWith('steps[4].for.signal: '))).toContain(
      'signal name "has space" is not allowed',
    );
    expect(found.find((p) => p.startsWith('steps[5].timeoutMs: '))).toContain(
      'timeoutMs bounds a wait for a signal only',
    );
    expect(found.some((p) => p.startsWith('steps[6].for'))).toBe(true);
    expect(found.find((p) => p.startsWith('steps[7].for: '))).toContain(fix);
  });
});

describe('waits in the machines', () => {
  const start = () => startRun(plan, { runId: 'r', at: T0 }).snapshot;
  const waitStarted = (stepId: string, extra: Partial<RunEvent> = {}): RunEvent =>
    ({ type: 'wait.started', stepId, attempt: 1, signal: 'go', at: T0 + 10, ...extra }) as RunEvent;
  const taken = (stepId: string, index: number): RunEvent => ({
    type: 'signal.taken',
    stepId,
    attempt: 1,
    name: 'go',
    index,
    seq: index + 1,
    at: T0 + 20,
  });
  const succeeded = (stepId: string, output: unknown): RunEvent =>
    ({ type: 'step.succeeded', stepId, attempt: 1, output, at: T0 + 20 }) as RunEvent;

  it('a waiting step is WAITING, the run waiting, and the wait planned with its due time', () => {
    let s = start();
    let t = advanceRun(s, waitStarted('w1'));
    s = t.snapshot;
    t = advanceRun(s, waitStarted('w2'));
    s = t.snapshot;
    t = advanceRun(s, {
      type: 'wait.started',
      stepId: 't',
      attempt: 1,
      dueAt: T0 + 5010,
      at: T0 + 10,
    });
    expect(t.planned).toEqual([{ type: 'step.wait', stepId: 't', attempt: 1, dueAt: T0 + 5010 }]);
    s = t.snapshot;
    expect(runStatus(s)).toBe('waiting');
    const steps = runSteps(s);
    expect(steps.map((x) => x.status)).toEqual(['WAITING', 'WAITING', 'WAITING']);
    expect(steps[0]!.wait).toEqual({ signal: 'go', dueAt: null, since: T0 + 10 });
    // Only the timer has a job while the steps wait; it is due at its stored time.
    const jobs = dueJobs('r', s, T0 + 1000);
    expect(jobs).toEqual([
      {
        name: 'wake',
        data: { runId: 'r', stepId: 't', attempt: 1 },
        opts: { jobId: timerJobId('r', 't', 1), delay: 4010 },
      },
    ]);
  });

  it('a signal is taken once: the cursor of its name moves with the step that takes it', () => {
    let s = start();
    s = advanceRun(s, waitStarted('w1')).snapshot;
    s = advanceRun(s, waitStarted('w2')).snapshot;
    // w1 takes signal 0.
    let t = advanceRun(s, taken('w1', 0));
    expect(t.accepted).toBe(true);
    s = advanceRun(t.snapshot, succeeded('w1', { n: 0 })).snapshot;
    expect(s.context.taken).toEqual({ go: 1 });
    // w2 cannot take signal 0 again, nor skip ahead to 2.
    expect(advanceRun(s, taken('w2', 0)).accepted).toBe(false);
    expect(advanceRun(s, taken('w2', 2)).accepted).toBe(false);
    // A step that is done takes nothing.
    expect(advanceRun(s, taken('w1', 1)).accepted).toBe(false);
    t = advanceRun(s, taken('w2', 1));
    expect(t.accepted).toBe(true);
    s = advanceRun(t.snapshot, succeeded('w2', { n: 1 })).snapshot;
    expect(s.context.taken).toEqual({ go: 2 });
    expect(runSteps(s).map((x) => x.output)).toEqual([{ n: 0 }, { n: 1 }, null]);
  });

  it('a cancelled wait ends CANCELLED; a wait fails final, never retried', () => {
    let s = start();
    s = advanceRun(s, waitStarted('w1')).snapshot;
    s = advanceRun(s, {
      type: 'step.failed',
      stepId: 'w1',
      attempt: 1,
      error: { name: 'WaitTimeoutError', code: 'wait_timeout', message: 'x', retryable: false },
      jitterSeed: 1,
      at: T0 + 30,
    }).snapshot;
    expect(runSteps(s)[0]!.status).toBe('FAILED_FINAL');
    s = advanceRun(s, waitStarted('w2')).snapshot;
    const t = advanceRun(s, { type: 'run.cancelled', at: T0 + 40 });
    expect(t.changes.filter((c) => c.from === 'WAITING').map((c) => c.to)).toEqual(['CANCELLED']);
  });
});
