import { describe, expect, it } from 'vitest';
import { factsOf } from '../../src/actors/run-host.js';
import { advanceRun, startRun, type RunSnapshot } from '../../src/machines/kernel.js';
import { refoldRun, snapshotDifferences, type FoldedEvent } from '../../src/machines/refold.js';
import { forkScope, isDraftProducing } from '../../src/plan/replay-scope.js';
import type { Plan } from '../../src/plan/schema.js';
import type { RunEvent } from '../../src/schemas/events.js';
import { e, planOf, T0 } from '../helpers/run-trace.js';

const diamond = planOf([
  { id: 'a', kind: 'operator', operator: 'op' },
  { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'] },
  { id: 'c', kind: 'operator', operator: 'op', dependsOn: ['a'] },
  { id: 'd', kind: 'operator', operator: 'op', dependsOn: ['b', 'c'] },
  { id: 'e', kind: 'human_gate', dependsOn: ['a'] },
]);

/** The stream a run host would store for `events`: run.created, each event and its facts. */
function streamOf(
  plan: Plan,
  events: readonly RunEvent[],
): { stream: FoldedEvent[]; snapshot: RunSnapshot } {
  const first = startRun(plan, { runId: 'r1', at: T0 });
  const records = factsOf(
    { type: 'run.created', runId: 'r1', plan: plan.name, at: T0 },
    null,
    first,
  );
  let { snapshot, status } = first;
  for (const event of events) {
    const t = advanceRun(snapshot, event);
    records.push(...factsOf(event, status, t));
    snapshot = t.snapshot;
    status = t.status;
  }
  const stream = records.map((r, i) => ({ id: `${i + 1}-0`, type: r.type, data: r }));
  return { stream, snapshot: JSON.parse(JSON.stringify(snapshot)) as RunSnapshot };
}

describe('forkScope and isDraftProducing', () => {
  it('a fork runs the step and everything downstream of it', () => {
    expect([...forkScope(diamond, 'b')].sort()).toEqual(['b', 'd']);
    expect([...forkScope(diamond, 'a')].sort()).toEqual(['a', 'b', 'c', 'd', 'e']);
    expect([...forkScope(diamond, 'd')]).toEqual(['d']);
  });

  it('refuses an unknown step, naming fromStep and the steps there are', () => {
    expect(() => forkScope(diamond, 'z')).toThrow(/has no step "z"; it has: a, b, c, d, e/);
  });

  it('agent steps and stable nondeterministic steps produce drafts', () => {
    const plan = planOf([
      { id: 'op', kind: 'operator', operator: 'op' },
      { id: 'agent', kind: 'agent', agent: 'x' },
      {
        id: 'cached',
        kind: 'operator',
        operator: 'op',
        cachePolicy: { class: 'stable_nondeterministic', allowCacheHit: false },
      },
    ]);
    expect(plan.steps.map(isDraftProducing)).toEqual([false, true, true]);
  });
});

describe('refoldRun', () => {
  const events = [e.ok('a'), e.fail('b'), e.approve('e'), e.ok('c')];

  it('folds the stored events to the stored snapshot', () => {
    const { stream, snapshot } = streamOf(diamond, events);
    const folded = refoldRun(diamond, stream);
    expect(folded.problems).toEqual([]);
    expect(snapshotDifferences(snapshot, JSON.parse(JSON.stringify(folded.snapshot)))).toEqual([]);
  });

  it('reports where a stored snapshot differs from what its events give', () => {
    const { stream, snapshot } = streamOf(diamond, events);
    const planted = structuredClone(snapshot);
    planted.children['c']!.snapshot.value = 'FAILED_FINAL';
    const folded = JSON.parse(JSON.stringify(refoldRun(diamond, stream).snapshot)) as unknown;
    expect(snapshotDifferences(planted, folded)).toEqual([
      { path: 'children.c.snapshot.value', stored: 'FAILED_FINAL', derived: 'SUCCEEDED' },
    ]);
  });

  it('names an event the machines refuse, and a stream without run.created', () => {
    const { stream } = streamOf(diamond, events);
    const bogus = { id: '99-0', type: 'step.succeeded', data: { ...e.ok('a', 7) } };
    expect(refoldRun(diamond, [...stream, bogus]).problems).toEqual([
      'event 99-0 (step.succeeded) was refused by the machines',
    ]);
    const broken = { id: '98-0', type: 'step.succeeded', data: { type: 'step.succeeded' } };
    expect(refoldRun(diamond, [...stream, broken]).problems[0]).toMatch(
      /^event 98-0 \(step.succeeded\) is unreadable/,
    );
    expect(refoldRun(diamond, stream.slice(1)).problems).toContain(
      'the stream has no run.created event',
    );
  });

  it('lists differences of arrays, absent fields and leaves, at most `limit`', () => {
    expect(snapshotDifferences({ a: [1, 2], b: 1 }, { a: [1, 3], c: 2 })).toEqual([
      { path: 'a.1', stored: 2, derived: 3 },
      { path: 'b', stored: 1, derived: undefined },
      { path: 'c', stored: undefined, derived: 2 },
    ]);
    expect(snapshotDifferences({ x: 1, y: 1 }, { x: 2, y: 2 }, 1)).toHaveLength(1);
    expect(snapshotDifferences(1, [1])).toEqual([{ path: '(root)', stored: 1, derived: [1] }]);
  });
});
