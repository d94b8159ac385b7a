import { describe, expect, it } from 'vitest';
import { createActor } from 'xstate';
import {
  advanceRun,
  persistedSnapshot,
  startRun,
  type RunSnapshot,
} from '../../src/machines/kernel.js';
import { runMachine } from '../../src/machines/run-machine.js';
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

  it('restoring after every event (always-restore) matches one actor that was never persisted', () => {
    // One live actor, fed every event in turn.
    const livePlanned: PlannedAction[] = [];
    const live = createActor(runMachine, { input: { runId: 'p', plan, at: T0 } });
    live.on('planned', (x) => livePlanned.push(x.action));
    live.start();
    for (const event of script) live.send(event);
    const liveSnapshot = live.getPersistedSnapshot();
    live.stop();

    // The kernel, rehydrating from JSON before every event.
    const first = startRun(plan, { runId: 'p', at: T0 });
    const planned = [...first.planned];
    let snap = first.snapshot;
    for (const event of script) {
      const t = advanceRun(roundTrip(snap), event);
      planned.push(...t.planned);
      snap = t.snapshot;
    }
    expect(roundTrip(snap)).toEqual(roundTrip(liveSnapshot as unknown as RunSnapshot));
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

describe('the kernel reads the persisted snapshot the way xstate does', () => {
  it('equals getPersistedSnapshot after every event of a script, also through JSON', () => {
    const live = createActor(runMachine, { input: { runId: 'p', plan, at: T0 } });
    live.start();
    const check = () => {
      const ours = persistedSnapshot(live);
      expect(ours).toEqual(live.getPersistedSnapshot());
      expect(JSON.parse(JSON.stringify(ours))).toEqual(
        JSON.parse(JSON.stringify(live.getPersistedSnapshot())),
      );
    };
    check();
    for (const event of [...script, e.resume(), e.ok('e', 2)]) {
      live.send(event);
      check();
    }
    expect(live.getSnapshot().value).toBe('succeeded');
    live.stop();
  });
});
