/**
 * A run held open by the kernel (as a worker holds it between events) against the same run
 * restored for each event: random walks over wide plans, where the held run persists only the
 * steps an event moved, builds its step entries lazily and changes the views it copied within one
 * event in place. After every event both must give the same snapshot, the status read off the
 * views' tally must be the one derived from every step, and no snapshot handed out earlier may
 * have changed.
 */
import { describe, expect, it } from 'vitest';
import {
  advanceRun,
  openRun,
  startOpenRun,
  stepEntry,
  type OpenRun,
  type RunSnapshot,
} from '../../src/machines/kernel.js';
import { runSnapshotDelta } from '../../src/machines/stored-snapshot.js';
import { statusOf } from '../../src/machines/run-machine.js';
import { deriveRunStatus } from '../../src/machines/run-status.js';
import { unitFromSeed } from '../../src/internal/rng.js';
import type { RunEvent } from '../../src/schemas/events.js';
import { candidateEvents } from '../helpers/run-graph.js';
import { planOf, T0 } from '../helpers/run-trace.js';

function fanOut(leaves: number) {
  return planOf([
    { id: 'root', kind: 'operator', operator: 'op' },
    ...Array.from({ length: leaves }, (_, i) => ({
      id: `l${i}`,
      kind: 'operator' as const,
      operator: 'op',
      dependsOn: ['root'],
      ...(i % 7 === 3 ? { gate: {} } : {}),
    })),
    { id: 'mid', kind: 'operator', operator: 'op', dependsOn: ['l0', 'l1'] },
    {
      id: 'join',
      kind: 'operator',
      operator: 'op',
      dependsOn: [...Array.from({ length: leaves }, (_, i) => `l${i}`), 'mid'],
    },
  ]);
}

const json = (s: RunSnapshot): string => JSON.stringify(s);

function checkAgainstRestored(prev: RunSnapshot, event: RunEvent, held: RunSnapshot): void {
  const restored = advanceRun(JSON.parse(json(prev)) as RunSnapshot, event).snapshot;
  expect(JSON.parse(json(held))).toEqual(JSON.parse(json(restored)));
}

function checkStatus(s: RunSnapshot): void {
  const derived = deriveRunStatus({
    steps: s.context.steps,
    dependsOn: s.context.dependsOn,
    cancelRequested: s.context.cancel !== null,
    stopped: s.context.stop !== null,
  });
  expect(statusOf(s.context)).toBe(derived);
}

/** A random walk of `moves` events over a run of `plan`, checking each event. */
function walk(leaves: number, seed: number, moves: number): number {
  let draws = seed * 7919;
  const rng = (): number => unitFromSeed(draws++);
  const plan = fanOut(leaves);
  const { run: opened } = startOpenRun(plan, { runId: `w${seed}`, at: T0 });
  let run: OpenRun = opened;
  const handedOut: [RunSnapshot, string][] = [];
  let fed = 0;
  for (let i = 0; i < moves && run.snapshot.status === 'active'; i++) {
    const prev = run.snapshot;
    const events = candidateEvents(prev).filter((e) => e.type !== 'run.resumed' || rng() < 0.2);
    // Mostly progress: a result of a running step, else anything.
    const progress = events.filter((e) => e.type === 'step.started' || e.type === 'step.succeeded');
    const pool = progress.length > 0 && rng() < 0.8 ? progress : events;
    const event = pool[Math.floor(rng() * pool.length)]!;
    const t = run.send(event);
    if (!t.accepted) continue;
    fed++;
    checkAgainstRestored(prev, event, t.snapshot);
    checkStatus(t.snapshot);
    // The delta a commit writes is the same with the kernel's note of the moved steps as without.
    const noted = runSnapshotDelta(prev, t.snapshot);
    const plain = runSnapshotDelta(
      JSON.parse(json(prev)) as RunSnapshot,
      JSON.parse(json(t.snapshot)) as RunSnapshot,
    );
    expect(noted.parts).toEqual(plain.parts);
    expect(noted.outputs).toEqual(plain.outputs);
    handedOut.push([t.snapshot, json(t.snapshot)]);
    // A point read agrees with the children built whole.
    const id = prev.context.order[Math.floor(rng() * prev.context.order.length)]!;
    expect(stepEntry(t.snapshot, id)).toBe(t.snapshot.children[id]);
    // Now and then the run is let go and opened again from its snapshot (a worker's cache miss).
    if (rng() < 0.05) run = openRun(t.snapshot);
  }
  for (const [s, text] of handedOut) expect(json(s)).toBe(text);
  return fed;
}

describe('a wide run held open', () => {
  it('gives what a run restored for each event gives, with the status of all its steps', () => {
    let fed = 0;
    for (let seed = 1; seed <= 30; seed++) fed += walk(40, seed, 400);

    expect(fed).toBeGreaterThan(1000);
  });

  it('runs a fan-out of 1,000 steps to its end, each step once', () => {
    const plan = fanOut(997);
    const { run } = startOpenRun(plan, { runId: 'wide', at: T0 });
    let at = T0;
    const starts = new Map<string, number>();
    for (let round = 0; round < 10 && run.snapshot.status === 'active'; round++) {
      for (const id of run.snapshot.context.order) {
        const view = run.snapshot.context.steps[id]!;
        if (view.status === 'WAITING_APPROVAL') {
          run.send({ type: 'gate.approved', stepId: id, at: ++at } as RunEvent);
        } else if (view.status === 'READY') {
          starts.set(id, (starts.get(id) ?? 0) + 1);
          const pair = run.sendStartedWith(
            { type: 'step.started', stepId: id, attempt: view.attempt, at: ++at },
            {
              type: 'step.succeeded',
              stepId: id,
              attempt: view.attempt,
              output: id,
              at: ++at,
            },
          );
          expect(pair).not.toBeNull();
        }
      }
    }
    expect(run.snapshot.value).toBe('succeeded');
    expect(starts.size).toBe(1000);
    expect([...starts.values()].every((n) => n === 1)).toBe(true);
    expect(Object.keys(run.snapshot.children)).toEqual(plan.steps.map((s) => s.id));
    expect(run.snapshot.children['l500']!.snapshot.context.output).toBe('l500');
  });
});
