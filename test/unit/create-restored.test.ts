/**
 * A run of many steps is created by restoring its actors (`createRestored`) rather than letting
 * its machine's entry spawn them: both ways must come to the same first transition, for plans of
 * every kind of step, whatever their dependencies.
 */
import { createActor } from 'xstate';
import { describe, expect, it } from 'vitest';
import { createRestored, startRun, type RunTransition } from '../../src/machines/kernel.js';
import { runMachine } from '../../src/machines/run-machine.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import type { PlanInput } from '../../src/plan/schema.js';

const kinds: PlanInput['steps'] = [
  { id: 'a', kind: 'operator', operator: 'op' },
  { id: 'g', kind: 'human_gate' },
  { id: 'gated', kind: 'operator', operator: 'op', gate: {} },
  { id: 'w', kind: 'wait', for: { signal: 'go' } },
  { id: 't', kind: 'wait', for: { durationMs: 5000 } },
  { id: 'agent', kind: 'agent', agent: 'helper', mode: 'granular' },
  { id: 'atomic', kind: 'agent', agent: 'helper' },
  { id: 'child', kind: 'run', plan: 'sub' },
  { id: 'fb', kind: 'operator', operator: 'op', fallback: { operator: 'backup' } },
  { id: 'm', kind: 'map', over: 'a', dependsOn: ['a'], item: { kind: 'operator', operator: 'op' } },
  {
    id: 'c',
    kind: 'operator',
    operator: 'op',
    dependsOn: ['a'],
    when: { step: 'a', exists: true },
  },
  { id: 'j', kind: 'operator', operator: 'op', dependsOn: ['g', 'c', 'm'] },
];

const comparable = (t: RunTransition) => ({
  snapshot: JSON.parse(JSON.stringify(t.snapshot)) as unknown,
  order: Object.keys(t.snapshot.children),
  status: t.status,
  planned: t.planned,
  changes: t.changes,
});

describe('a run created by restoring its actors', () => {
  it('is the run its machine creates, for plans of every kind of step', () => {
    const plans = [
      kinds,
      // Independent, in another order.
      [...kinds].reverse().filter((s) => (s.dependsOn ?? []).length === 0),
      // No operator root: the gates and waits first.
      kinds.filter((s) => s.id !== 'a' && !(s.dependsOn ?? []).includes('a') && s.id !== 'j'),
    ];
    for (const [i, steps] of plans.entries()) {
      const plan = parsePlan({ name: `kinds-${i}`, steps });
      const options = { runId: `r${i}`, at: 1_700_000_000_000 + i };
      // A plan's first start below the restoring size is created by the machine's entry.
      const spawned = startRun(plan, options);
      const restored = createRestored(plan, options).transition;
      expect(comparable(restored)).toEqual(comparable(spawned));
      expect(restored.planned.length).toBeGreaterThan(0);
    }
  });

  it('is the run its machine creates for a fan-out of 300 steps', () => {
    const plan = parsePlan({
      name: 'wide',
      steps: [
        { id: 'root', kind: 'operator', operator: 'op' },
        { id: 'gate', kind: 'human_gate' },
        ...Array.from({ length: 297 }, (_, i) => ({
          id: `l${i}`,
          kind: 'operator' as const,
          operator: 'op',
          dependsOn: [i % 2 === 0 ? 'root' : 'gate'],
        })),
        { id: 'join', kind: 'operator', operator: 'op', dependsOn: ['l0', 'l1', 'l296'] },
      ],
    });
    const at = 1_700_000_000_000;
    const restored = createRestored(plan, { runId: 'wide', at }).transition;
    const actor = createActor(runMachine, { input: { runId: 'wide', plan, at } }).start();
    const spawned = actor.getPersistedSnapshot() as RunTransition['snapshot'];
    const json = (value: unknown): unknown => JSON.parse(JSON.stringify(value));
    expect(json(restored.snapshot.context)).toEqual(json(spawned.context));
    expect(restored.snapshot.value).toBe(spawned.value);
    for (const id of Object.keys(spawned.children)) {
      expect(json(restored.snapshot.children[id]!.snapshot)).toEqual(
        json(spawned.children[id]!.snapshot),
      );
    }
    expect(Object.keys(restored.snapshot.children)).toEqual(plan.steps.map((s) => s.id));
    expect(restored.planned.map((p) => p.type)).toEqual(['step.execute', 'step.requestApproval']);
  });
});
