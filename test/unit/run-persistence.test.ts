import { describe, expect, it } from 'vitest';
import { createActor } from 'xstate';
import { advanceRun, openRun, startRun, type RunSnapshot } from '../../src/machines/kernel.js';
import { stepMachine } from '../../src/machines/step-machine.js';
import {
  compactRunSnapshot,
  expandRunSnapshot,
  joinRunParts,
  runSnapshotDelta,
  type StoredRunSnapshot,
} from '../../src/machines/stored-snapshot.js';
import type { PlannedAction } from '../../src/machines/types.js';
import type { RunEvent } from '../../src/schemas/events.js';
import { candidateEvents } from '../helpers/run-graph.js';
import { e, planOf, T0 } from '../helpers/run-trace.js';

const plan = planOf([
  { id: 'a', kind: 'operator', operator: 'op' },
  { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'], gate: { approvers: ['ana'] } },
  { id: 'c', kind: 'operator', operator: 'op', dependsOn: ['a'] },
  { id: 'd', kind: 'operator', operator: 'op', dependsOn: ['b', 'c'] },
  { id: 'e', kind: 'operator', operator: 'op' },
]);

const script: RunEvent[] = [
  e.ok('a'),
  e.fail('c', 1),
  e.approve('b'),
  e.due('c', 2),
  e.ok('b', 1, { rows: [1, 2, 3], note: 'ünïcødé ✓' }),
  e.fail('e', 1, false),
  e.ok('c', 2),
  e.ok('d'),
];

const roundTrip = (s: RunSnapshot): RunSnapshot => JSON.parse(JSON.stringify(s)) as RunSnapshot;

describe('persist → JSON → restore', () => {
  it('after every event, the restored snapshot is the same state with the same next transitions', () => {
    let snap = startRun(plan, { runId: 'p', at: T0 }).snapshot;
    for (const event of script) {
      const restored = roundTrip(snap);
      expect(restored).toEqual(snap);
      // Same next transitions: every candidate event gives the same result from both.
      const candidates = [...candidateEvents(snap), event];
      for (const candidate of candidates) {
        expect(advanceRun(restored, candidate)).toEqual(advanceRun(snap, candidate));
      }
      snap = advanceRun(restored, event).snapshot;
    }
    expect(snap.value).toBe('failed');
  });

  it('restoring after every event (always-restore) matches one run that was never persisted', () => {
    // One run held in memory, fed every event in turn.
    const first = startRun(plan, { runId: 'p', at: T0 });
    const live = openRun(first.snapshot);
    const livePlanned: PlannedAction[] = [...first.planned];
    for (const event of script) livePlanned.push(...live.send(event).planned);

    // The kernel, rehydrating from JSON before every event.
    const planned = [...first.planned];
    let snap = first.snapshot;
    for (const event of script) {
      const t = advanceRun(roundTrip(snap), event);
      planned.push(...t.planned);
      snap = t.snapshot;
    }
    expect(roundTrip(snap)).toEqual(roundTrip(live.snapshot));
    expect(planned).toEqual(livePlanned);
    expect(planned.length).toBeGreaterThan(5);
  });

  it('is deterministic: the same events give byte-identical snapshots', () => {
    const runOnce = () => {
      let snap = startRun(plan, { runId: 'p', at: T0 }).snapshot;
      for (const event of script) snap = advanceRun(snap, event).snapshot;
      return JSON.stringify(snap);
    };
    expect(runOnce()).toBe(runOnce());
  });
});

describe('the persisted snapshot is what xstate persists', () => {
  it('each step restores into an xstate actor of the step machine with the same state and context', () => {
    let snap = startRun(plan, { runId: 'p', at: T0 }).snapshot;
    for (const event of [...script, e.resume(), e.ok('e', 2)]) {
      snap = roundTrip(advanceRun(snap, event).snapshot);
      for (const [id, child] of Object.entries(snap.children)) {
        const actor = createActor(stepMachine, {
          snapshot: child.snapshot,
          input: undefined as never,
        });
        const restored = actor.getPersistedSnapshot() as unknown as typeof child.snapshot;
        expect(restored.value, id).toBe(child.snapshot.value);
        expect(restored.context, id).toEqual(child.snapshot.context);
        expect(restored.status, id).toBe(child.snapshot.status);
      }
    }
    expect(snap.value).toBe('succeeded');
    expect(snap.status).toBe('done');
  });
});

describe('the stored form (schema 3)', () => {
  it('expands back to the same snapshot after every event, through JSON, at a third of the size', () => {
    let snap = startRun(plan, { runId: 'p', at: T0 }).snapshot;
    for (const event of [...script, e.resume(), e.ok('e', 2)]) {
      snap = advanceRun(snap, event).snapshot;
      const stored = JSON.stringify(compactRunSnapshot(snap));
      expect(expandRunSnapshot(JSON.parse(stored) as StoredRunSnapshot)).toEqual(roundTrip(snap));
      expect(stored.length).toBeLessThan(JSON.stringify(snap).length / 2);
    }
  });

  it('shares one copy of each retry policy and keeps fields it does not know', () => {
    const snap = startRun(plan, { runId: 'p', at: T0 }).snapshot;
    const stored = compactRunSnapshot(snap);
    expect(stored.r).toHaveLength(1);
    expect(Object.values(stored.s).map((s) => s.r)).toEqual([0, 0, 0, 0, 0]);
    // A gated step keeps needsApproval; the others leave it out at its default.
    expect(stored.s['b']).toMatchObject({ v: 'PENDING', needsApproval: true });
    expect(stored.s['a']).not.toHaveProperty('needsApproval');
    (stored.s['a'] as Record<string, unknown>)['future'] = { x: 1 };
    const back = expandRunSnapshot(JSON.parse(JSON.stringify(stored)) as StoredRunSnapshot);
    expect(back.children['a']?.snapshot.context).toMatchObject({ future: { x: 1 }, agent: null });
  });
});

describe('the split layout (schema 4)', () => {
  it('after every event, the fields written so far join back into the same snapshot', () => {
    const run = openRun(startRun(plan, { runId: 'p', at: T0 }).snapshot);
    let snap = run.snapshot;
    const fields: Record<string, string> = {};
    const outputs: Record<string, string> = {};
    const write = (previous: RunSnapshot | undefined, next: RunSnapshot) => {
      const delta = runSnapshotDelta(previous, next);
      Object.assign(fields, delta.parts);
      Object.assign(outputs, delta.outputs);
      for (const id of delta.dropOutputs) delete outputs[id];
      return delta;
    };
    write(undefined, snap);
    for (const event of script) {
      const next = run.send(event).snapshot;
      const delta = write(snap, next);
      // The run's field, and only the fields of steps that moved (never the static order).
      const stepFields = Object.keys(delta.parts).filter((f) => f.startsWith('s:'));
      expect(Object.keys(delta.parts)).toContain('run');
      expect(Object.keys(delta.parts)).not.toContain('plan');
      expect(stepFields.length).toBeLessThanOrEqual(3);
      expect(expandRunSnapshot(joinRunParts(fields, outputs))).toEqual(roundTrip(next));
      snap = next;
    }
    run.close();
    // Outputs are stored once, apart from the step fields.
    expect(JSON.parse(outputs['b']!)).toEqual({ rows: [1, 2, 3], note: 'ünïcødé ✓' });
    expect(fields['s:b']).not.toContain('rows');
  });

  it('writes an output once: a later commit does not send it again', () => {
    const run = openRun(startRun(plan, { runId: 'p', at: T0 }).snapshot);
    const first = run.snapshot;
    const afterA = run.send(e.ok('a', 1, { big: 'x'.repeat(10_000) })).snapshot;
    expect(Object.keys(runSnapshotDelta(first, afterA).outputs)).toEqual(['a']);
    const afterC = run.send(e.fail('c', 1)).snapshot;
    const delta = runSnapshotDelta(afterA, afterC);
    expect(delta.outputs).toEqual({});
    expect(JSON.stringify(delta).length).toBeLessThan(2000);
    run.close();
  });

  it('names the part that is missing', () => {
    const snap = startRun(plan, { runId: 'p', at: T0 }).snapshot;
    const { parts } = runSnapshotDelta(undefined, snap);
    const { ['s:c']: _c, ...partial } = parts;
    expect(() => joinRunParts(partial, {})).toThrow('field "s:c" is missing');
  });
});
