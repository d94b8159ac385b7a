/**
 * Run steps (child runs) in the pure core: the plan schema of a run step, and what the machines do
 * with a wait for a child (`wait.started` naming it: the run counts as running, the snapshot asks
 * for no timer) and with the child's failure (the step's retry policy decides).
 */
import { describe, expect, it } from 'vitest';
import { dueJobs } from '../../src/actors/jobs.js';
import { childRunId, childResult } from '../../src/actors/child.js';
import { PlanValidationError } from '../../src/errors.js';
import { advanceRun, runStatus, runSteps, startRun } from '../../src/machines/kernel.js';
import { compactRunSnapshot } from '../../src/machines/stored-snapshot.js';
import { parsePlan } from '../../src/plan/parse-plan.js';

const T0 = 1_800_000_000_000;

const plan = parsePlan({
  name: 'supervisor',
  steps: [
    { id: 'child', kind: 'run', plan: 'worker', retry: { maxAttempts: 2, initialDelayMs: 10 } },
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

describe('the run step in a plan', () => {
  it('takes a plan name and onParentCancel, and refuses its own time limit and budgets', () => {
    expect(
      parsePlan({ name: 'p', steps: [{ id: 'a', kind: 'run', plan: 'x' }] }).steps[0],
    ).toMatchObject({ kind: 'run', plan: 'x', onParentCancel: 'cancel' });
    const found = problems([
      { id: 'a', kind: 'run', plan: 'x', timeoutMs: 5 },
      { id: 'b', kind: 'run', plan: 'x', budgets: { maxToolCalls: 1 } },
      { id: 'c', kind: 'run', plan: '' },
      { id: 'd', kind: 'run', plan: 'x', onParentCancel: 'ignore' },
    ]);
    expect(found.some((p) => p.startsWith('steps[0].timeoutMs: a run step'))).toBe(true);
    expect(found.some((p) => p.startsWith('steps[1].budgets: a run step'))).toBe(true);
    expect(found.some((p) => p.startsWith('steps[2].plan'))).toBe(true);
    expect(found.some((p) => p.startsWith('steps[3].onParentCancel'))).toBe(true);
  });

  it('derives the child id from the run, the step and the attempt', () => {
    expect(childRunId('r1', 'child', 1)).toBe('r1:child:1');
    expect(childRunId('r1', 'child', 2)).toBe('r1:child:2');
    const long = childRunId('x'.repeat(190), 'child', 1);
    expect(long.length).toBeLessThanOrEqual(200);
    expect(childRunId('x'.repeat(190), 'child', 1)).toBe(long);
    expect(childRunId('x'.repeat(190), 'child', 2)).not.toBe(long);
  });
});

describe('a run step in the machines', () => {
  const start = () => startRun(plan, { runId: 'r', at: T0 }).snapshot;
  const waiting = () =>
    advanceRun(start(), {
      type: 'wait.started',
      stepId: 'child',
      attempt: 1,
      child: 'r:child:1',
      at: T0 + 1,
    }).snapshot;

  it('waits for its child in WAITING, the run running meanwhile, with no timer due', () => {
    const s = waiting();
    const step = runSteps(s).find((x) => x.stepId === 'child')!;
    expect(step.status).toBe('WAITING');
    expect(step.wait).toMatchObject({ child: 'r:child:1', dueAt: null });
    expect(runStatus(s)).toBe('running');
    expect(dueJobs('r', s, T0 + 2)).toEqual([]);
    // The stored form keeps it running.
    expect(compactRunSnapshot(s).s['child']).toMatchObject({ v: 'WAITING' });
  });

  it('retries a failed child as a new attempt, and fails finally when attempts are spent', () => {
    const error = { name: 'ChildFailedError', code: 'child_failed', message: 'x', retryable: true };
    let s = advanceRun(waiting(), {
      type: 'step.failed',
      stepId: 'child',
      attempt: 1,
      error,
      jitterSeed: 1,
      at: T0 + 2,
    }).snapshot;
    expect(runSteps(s)[0]!.status).toBe('FAILED_RETRYABLE');
    s = advanceRun(s, { type: 'retry.due', stepId: 'child', attempt: 2, at: T0 + 20 }).snapshot;
    expect(runSteps(s)[0]).toMatchObject({ status: 'READY', attempt: 2 });
    s = advanceRun(s, {
      type: 'wait.started',
      stepId: 'child',
      attempt: 2,
      child: 'r:child:2',
      at: T0 + 21,
    }).snapshot;
    s = advanceRun(s, {
      type: 'step.failed',
      stepId: 'child',
      attempt: 2,
      error,
      jitterSeed: 1,
      at: T0 + 22,
    }).snapshot;
    expect(runSteps(s)[0]!.status).toBe('FAILED_FINAL');
    expect(runStatus(s)).toBe('failed');
  });

  it("takes the child's last steps' outputs as its result", () => {
    const child = parsePlan({
      name: 'c',
      steps: [
        { id: 'a', kind: 'operator', operator: 'o' },
        { id: 'b', kind: 'operator', operator: 'o', dependsOn: ['a'] },
      ],
    });
    let s = startRun(child, { runId: 'c', at: T0 }).snapshot;
    s = advanceRun(s, {
      type: 'step.succeeded',
      stepId: 'a',
      attempt: 1,
      output: 1,
      at: T0,
    }).snapshot;
    s = advanceRun(s, {
      type: 'step.succeeded',
      stepId: 'b',
      attempt: 1,
      output: 2,
      at: T0,
    }).snapshot;
    expect(childResult(child, s)).toEqual({ b: 2 });
  });
});
