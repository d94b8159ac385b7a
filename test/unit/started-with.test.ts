import { getAdjacencyMap } from '@xstate/graph';
import { describe, expect, it, vi } from 'vitest';
import type { SnapshotFrom } from 'xstate';
import { openRun, runSteps, startRun, type RunSnapshot } from '../../src/machines/kernel.js';
import type { Plan } from '../../src/plan/schema.js';
import type { RunEvent } from '../../src/schemas/events.js';
import { candidateEvents, nodesOf, runLogic, serializeRun } from '../helpers/run-graph.js';
import { e, planOf } from '../helpers/run-trace.js';

type Wrapped = SnapshotFrom<ReturnType<typeof runLogic>>;

const retry = { maxAttempts: 2 };
const plans: [string, Plan][] = [
  [
    'a gated diamond',
    planOf([
      { id: 'a', kind: 'operator', operator: 'op', retry },
      { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'], gate: {}, retry },
      { id: 'c', kind: 'operator', operator: 'op', dependsOn: ['a'], retry },
      { id: 'd', kind: 'operator', operator: 'op', dependsOn: ['b', 'c'], retry },
    ]),
  ],
  [
    'a fan-out with a fallback',
    planOf([
      { id: 'root', kind: 'operator', operator: 'op', retry },
      {
        id: 'left',
        kind: 'operator',
        operator: 'op',
        dependsOn: ['root'],
        retry,
        fallback: { operator: 'backup' },
      },
      { id: 'right', kind: 'operator', operator: 'op', dependsOn: ['root'], retry },
    ]),
  ],
];

/** The results a worker commits with an attempt's start. */
function results(stepId: string, attempt: number): RunEvent[] {
  return [e.ok(stepId, attempt), e.fail(stepId, attempt, true), e.fail(stepId, attempt, false)];
}

describe('feeding an attempt start with its result as one', () => {
  it.each(plans)(
    'gives what feeding them one by one gives, in every reachable state of %s',
    (_, plan) => {
      const map = getAdjacencyMap(runLogic(plan), {
        events: (s: Wrapped) => candidateEvents(s.context),
        serializeState: (s: Wrapped) => serializeRun(s.context),
      });
      let compared = 0;
      for (const { state } of nodesOf<Wrapped, RunEvent>(map)) {
        const snapshot: RunSnapshot = state.context;
        for (const step of runSteps(snapshot)) {
          if (step.status !== 'READY') continue;
          const started = e.start(step.stepId, step.attempt);
          for (const result of results(step.stepId, step.attempt)) {
            const slow = openRun(snapshot);
            const first = slow.send(started);
            const second = slow.send(result);
            const fast = openRun(snapshot).sendStartedWith(started, result);
            expect(fast).not.toBeNull();
            const [f1, f2] = fast!;
            expect(f1).toEqual({
              status: first.status,
              planned: first.planned,
              changes: first.changes,
              accepted: true,
            });
            expect(f2).toEqual(second);
            compared++;
          }
        }
      }
      expect(compared).toBeGreaterThan(20);
    },
    120_000,
  );

  it('declines what it cannot feed as one, and feeds nothing then', () => {
    const plan = plans[0]![1];
    const run = openRun(startRun(plan, { runId: 'g', at: 0 }).snapshot);
    const before = run.snapshot;
    // Another step's result, a stale attempt, a result stamped before the start, a step not READY.
    expect(run.sendStartedWith(e.start('a', 1), e.ok('b', 1))).toBeNull();
    expect(run.sendStartedWith(e.start('a', 1), e.ok('a', 2))).toBeNull();
    expect(run.sendStartedWith({ ...e.start('a', 1), at: e.ok('a').at + 1 }, e.ok('a'))).toBeNull();
    expect(run.sendStartedWith(e.start('c', 1), e.ok('c', 1))).toBeNull();
    expect(run.sendStartedWith(e.ok('a', 1), e.ok('a', 1))).toBeNull();
    expect(run.snapshot).toBe(before);
  });

  it('ends a run on its last step without a message to the ended run actor', () => {
    // xstate warns (in development builds, as under vitest) of a message sent to an actor that
    // ended: the last step's done event, were it given straight to the step.
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => {});
    try {
      for (const plan of [
        planOf([{ id: 'only', kind: 'operator', operator: 'op' }]),
        planOf([
          { id: 'a', kind: 'operator', operator: 'op' },
          { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'] },
        ]),
      ]) {
        const run = openRun(startRun(plan, { runId: 'w', at: 0 }).snapshot);
        for (const { id } of plan.steps) {
          expect(run.sendStartedWith(e.start(id, 1), e.ok(id, 1))).not.toBeNull();
        }
        expect(run.snapshot.status).toBe('done');
      }
      expect(warn).not.toHaveBeenCalled();
    } finally {
      warn.mockRestore();
    }
  });
});
