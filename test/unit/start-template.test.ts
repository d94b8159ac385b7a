import { describe, expect, it } from 'vitest';
import { startOpenRun, startRun, type RunTransition } from '../../src/machines/kernel.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import type { PlanInput } from '../../src/plan/schema.js';
import type { RunEvent } from '../../src/schemas/events.js';
import { e, T0 } from '../helpers/run-trace.js';

// A run of a plan object started before is created from that plan's first transition, with its
// own id and time put in place (see `startOpenRun`). These plans cover what a start depends on:
// roots and dependents, gates (with approvers and a reason), risk levels, fallbacks, granular
// agent steps, policies, timeouts, budgets and retry policies.
const shapes: [string, PlanInput][] = [
  [
    'a line',
    {
      name: 'line',
      steps: Array.from({ length: 6 }, (_, i) => ({
        id: `s${i}`,
        kind: 'operator' as const,
        operator: 'op',
        dependsOn: i === 0 ? [] : [`s${i - 1}`],
      })),
    },
  ],
  [
    'a gated diamond with approvers and a risky step',
    {
      name: 'diamond',
      steps: [
        { id: 'a', kind: 'operator', operator: 'op', gate: { approvers: ['ana'], reason: 'why' } },
        { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'], riskLevel: 'high' },
        { id: 'c', kind: 'operator', operator: 'op', dependsOn: ['a'], timeoutMs: 50 },
        { id: 'd', kind: 'operator', operator: 'op', dependsOn: ['b', 'c'] },
      ],
    },
  ],
  [
    'roots with a fallback, a risk level, a policy and a budget',
    {
      name: 'fan',
      steps: [
        {
          id: 'left',
          kind: 'operator',
          operator: 'op',
          fallback: { operator: 'backup' },
          retry: { maxAttempts: 4, initialDelayMs: 10 },
        },
        { id: 'right', kind: 'operator', operator: 'op', riskLevel: 'critical' },
        { id: 'check', kind: 'policy_check', policy: 'p', budgets: { maxToolCalls: 2 } },
        { id: 'after', kind: 'operator', operator: 'op', dependsOn: ['left', 'right', 'check'] },
      ],
    },
  ],
  [
    'a granular agent step',
    {
      name: 'agent',
      steps: [
        { id: 'loop', kind: 'agent', agent: 'a', input: 'go', mode: 'granular', maxTurns: 5 },
        { id: 'then', kind: 'operator', operator: 'op', dependsOn: ['loop'] },
      ],
    },
  ],
];

/** What the machines give for a run of `input` created by its actors (a plan object never seen). */
const byActors = (input: PlanInput, runId: string, at: number): RunTransition =>
  startRun(parsePlan(input), { runId, at });

describe('a run of a plan object started before', () => {
  it.each(shapes)('is what its actors create, for %s', (_, input) => {
    const plan = parsePlan(input);
    // The first start is the actors'; the later ones fill the template made at the second.
    for (const [i, at] of [T0, T0 + 7, T0 + 4000, 5].entries()) {
      const runId = `run-${i}`;
      const { transition, run } = startOpenRun(plan, { runId, at });
      const expected = byActors(input, runId, at);
      expect(transition).toEqual(expected);
      expect(run.snapshot).toEqual(expected.snapshot);
      // It shares nothing with another run of the plan.
      expect(startOpenRun(plan, { runId: 'other', at: 1 }).transition.snapshot).not.toBe(
        transition.snapshot,
      );
    }
  });

  it('goes on exactly as a run its actors created', () => {
    const input = shapes[0]![1];
    const plan = parsePlan(input);
    startOpenRun(plan, { runId: 'warm', at: T0 });
    const { run: templated } = startOpenRun(plan, { runId: 'r', at: T0 });
    const { run: created } = startOpenRun(parsePlan(input), { runId: 'r', at: T0 });
    const feed = (run: typeof templated, events: RunEvent[]) => events.map((ev) => run.send(ev));
    const events = [e.start('s0'), e.ok('s0'), e.start('s1'), e.fail('s1', 1, true)];
    expect(feed(templated, events)).toEqual(feed(created, events));
    expect(templated.sendStartedWith(e.start('s0', 1), e.ok('s0', 1))).toEqual(
      created.sendStartedWith(e.start('s0', 1), e.ok('s0', 1)),
    );
  });

  it('keeps a plan value equal to a stand-in for the run (the template is refused, not misfilled)', () => {
    // The stand-in for the creation time, as a retry delay: the template check sees it move.
    const input: PlanInput = {
      name: 'collide',
      steps: [
        {
          id: 'a',
          kind: 'operator',
          operator: 'op',
          retry: { maxAttempts: 2, initialDelayMs: 2 ** 52 + 1, maxDelayMs: 2 ** 52 + 1 },
        },
      ],
    };
    let plan;
    try {
      plan = parsePlan(input);
    } catch {
      return; // Refused by the plan's own limits: nothing to collide with.
    }
    for (const [i, at] of [T0, T0 + 1, T0 + 2].entries()) {
      const { transition } = startOpenRun(plan, { runId: `r${i}`, at });
      expect(transition).toEqual(byActors(input, `r${i}`, at));
    }
  });
});
