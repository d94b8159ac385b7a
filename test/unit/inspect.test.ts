/**
 * The conversion of a run's transitions to xstate inspection events: which actors are announced
 * and when, the events and their source and target, the snapshots of the steps that moved; the
 * stream fold `flujo inspect` uses; the runtime's commit observer and its option check.
 */
import { describe, expect, it } from 'vitest';
import type { AnyActorRef, InspectionEvent } from 'xstate';
import { advanceRun, startRun, type RunSnapshot } from '../../src/machines/kernel.js';
import type { CommittedRun } from '../../src/actors/run-host.js';
import {
  checkInspectOption,
  commitInspector,
  inspectionEvents,
  inspectionJson,
  streamInspector,
} from '../../src/observability/inspect.js';
import { silentLogger, type Logger } from '../../src/logging.js';
import type { RunEvent } from '../../src/schemas/events.js';
import { planOf, T0 } from '../helpers/run-trace.js';

const plan = planOf([
  { id: 'a', kind: 'operator', operator: 'op' },
  { id: 'b', kind: 'operator', operator: 'op', dependsOn: ['a'] },
]);
const created = { type: 'run.created', runId: 'r1', plan: 'trace', at: T0 };
const startA: RunEvent = { type: 'step.started', stepId: 'a', attempt: 1, at: T0 + 1 };
const doneA: RunEvent = {
  type: 'step.succeeded',
  stepId: 'a',
  attempt: 1,
  output: { n: 1 },
  at: T0 + 2,
};

/** The events as `type session [source]` lines, for reading a whole sequence at once. */
function lines(events: InspectionEvent[]): string[] {
  return events.map((e) => {
    const ref = e.actorRef as AnyActorRef;
    switch (e.type) {
      case '@xstate.event': {
        const source = e.sourceRef === undefined ? '' : ` <- ${e.sourceRef.sessionId}`;
        return `event ${ref.sessionId} ${e.event.type}${source}`;
      }
      case '@xstate.snapshot':
        return `snapshot ${ref.sessionId} ${String((e.snapshot as unknown as { value: string }).value)}`;
      default:
        return `actor ${ref.sessionId} ${String((ref.getSnapshot() as { value: string }).value)}`;
    }
  });
}

function history(): { s0: RunSnapshot; s1: RunSnapshot; s2: RunSnapshot } {
  const s0 = startRun(plan, { runId: 'r1', at: T0 }).snapshot;
  const s1 = advanceRun(s0, startA).snapshot;
  const s2 = advanceRun(s1, doneA).snapshot;
  return { s0, s1, s2 };
}

describe('inspectionEvents', () => {
  it('announces the run and its steps at creation, then each event and what moved', () => {
    const { s0, s1, s2 } = history();
    const events = inspectionEvents('r1', [
      { event: created, before: null, after: s0 },
      { event: startA, before: s0, after: s1 },
      { event: doneA, before: s1, after: s2 },
    ]);
    expect(lines(events)).toEqual([
      'actor r1 running',
      'actor r1.a READY',
      'actor r1.b PENDING',
      'event r1 run.created',
      'snapshot r1.a READY',
      'snapshot r1.b PENDING',
      'snapshot r1 running',
      'event r1 step.started',
      'event r1.a step.started <- r1',
      'snapshot r1.a RUNNING',
      'snapshot r1 running',
      'event r1 step.succeeded',
      'event r1.a step.succeeded <- r1',
      'snapshot r1.a SUCCEEDED',
      'snapshot r1.b READY',
      'snapshot r1 running',
    ]);
    expect(events.every((e) => e.rootId === 'r1')).toBe(true);
  });

  it('gives refs that an inspector can read: ids, parent, logic, snapshot', () => {
    const { s0 } = history();
    const events = inspectionEvents('r1', [{ event: created, before: null, after: s0 }]);
    const run = events[0]!.actorRef as AnyActorRef;
    const step = events[1]!.actorRef as AnyActorRef;
    expect([run.id, run.sessionId, run._parent, run.src]).toEqual(['r1', 'r1', undefined, 'run']);
    expect([step.id, step.sessionId, step._parent?.sessionId, step.src]).toEqual([
      'a',
      'r1.a',
      'r1',
      'step',
    ]);
    const logic = (ref: AnyActorRef) =>
      (ref as unknown as { logic: { config: { id: string } } }).logic;
    expect(logic(run).config.id).toBe('run');
    expect(logic(step).config.id).toBe('step');
    expect(JSON.parse(JSON.stringify(run))).toEqual({ xstate$$type: 1, id: 'r1' });
    expect(() => run.send({ type: 'x' })).toThrow(/view of a stored run/);
    // The run's snapshot names its steps as references, the way xstate serializes children.
    const snapshot = events.at(-1) as Extract<InspectionEvent, { type: '@xstate.snapshot' }>;
    expect((snapshot.snapshot as unknown as RunSnapshot).children).toEqual({
      a: { xstate$$type: 1, id: 'a' },
      b: { xstate$$type: 1, id: 'b' },
    });
  });

  it('announces actors not seen yet with their snapshot from before the event', () => {
    const { s1, s2 } = history();
    const fresh = inspectionEvents('r1', [{ event: doneA, before: s1, after: s2 }]);
    expect(lines(fresh).slice(0, 4)).toEqual([
      'actor r1 running',
      'actor r1.a RUNNING',
      'actor r1.b PENDING',
      'event r1 step.succeeded',
    ]);
    const seen = new Set(['r1', 'r1.a', 'r1.b']);
    const known = inspectionEvents('r1', [{ event: doneA, before: s1, after: s2 }], seen);
    expect(lines(known)).toEqual(lines(fresh).slice(3));
  });

  it('a step whose snapshot was loaded without its output has not moved', () => {
    const { s2 } = history();
    const a = s2.children['a']!;
    const withoutOutput: RunSnapshot = {
      ...s2,
      children: {
        ...s2.children,
        a: { ...a, snapshot: { ...a.snapshot, context: { ...a.snapshot.context, output: null } } },
      },
    };
    const startB: RunEvent = { type: 'step.started', stepId: 'b', attempt: 1, at: T0 + 3 };
    const s3 = advanceRun(s2, startB).snapshot;
    const events = inspectionEvents(
      'r1',
      [{ event: startB, before: withoutOutput, after: s3 }],
      new Set(['r1', 'r1.a', 'r1.b']),
    );
    expect(lines(events)).toEqual([
      'event r1 step.started',
      'event r1.b step.started <- r1',
      'snapshot r1.b RUNNING',
      'snapshot r1 running',
    ]);
  });
});

describe('streamInspector', () => {
  it('folds a stored stream: fed events only, derived facts and records give nothing', () => {
    const { s0, s1, s2 } = history();
    const fold = streamInspector('r1', plan);
    const feed = (type: string, data: Record<string, unknown>) =>
      fold.feed({ id: `${T0}-0`, type, data: { type, ...data } });
    const out = [
      ...feed('run.created', created),
      ...feed('step.changed', { stepId: 'a', from: 'PENDING', to: 'READY' }),
      ...feed('step.started', startA),
      ...feed('tool.called', { stepId: 'a' }),
      ...feed('step.succeeded', doneA),
      // Refused by the machines (a stale attempt): never committed, nothing shown.
      ...feed('step.succeeded', { ...doneA, attempt: 9 }),
    ];
    expect(lines(out)).toEqual(
      lines(
        inspectionEvents('r1', [
          { event: created, before: null, after: s0 },
          { event: startA, before: s0, after: s1 },
          { event: doneA, before: s1, after: s2 },
        ]),
      ),
    );
  });
});

describe('inspectionJson', () => {
  it('reduces refs to { sessionId, id, parentSessionId }', () => {
    const { s0, s1 } = history();
    const events = inspectionEvents('r1', [
      { event: created, before: null, after: s0 },
      { event: startA, before: s0, after: s1 },
    ]);
    const json = events.map((e) => JSON.parse(JSON.stringify(inspectionJson(e))) as object);
    expect(json[1]).toMatchObject({
      type: '@xstate.actor',
      rootId: 'r1',
      actorRef: { sessionId: 'r1.a', id: 'a', parentSessionId: 'r1' },
      snapshot: { value: 'READY' },
    });
    expect(Object.keys(json[1]!)).toEqual(['type', 'rootId', 'actorRef', 'snapshot']);
    expect(json[3]).toEqual({
      type: '@xstate.event',
      rootId: 'r1',
      sourceRef: null,
      actorRef: { sessionId: 'r1', id: 'r1', parentSessionId: null },
      event: created,
    });
    const forwarded = json.find(
      (j) =>
        (j as { sourceRef?: unknown }).sourceRef !== undefined &&
        (j as { sourceRef: unknown }).sourceRef !== null,
    );
    expect(forwarded).toMatchObject({
      sourceRef: { sessionId: 'r1', id: 'r1', parentSessionId: null },
      actorRef: { sessionId: 'r1.a' },
      event: startA,
    });
  });
});

describe('commitInspector', () => {
  const commits = (): CommittedRun[] => {
    const { s0, s1, s2 } = history();
    return [
      { runId: 'r1', before: null, fed: [{ event: created as never, snapshot: s0 }] },
      {
        runId: 'r1',
        before: s0,
        fed: [
          { event: startA, snapshot: s1 },
          { event: doneA, snapshot: s2 },
        ],
      },
    ];
  };

  it('hands each commit to an observer object, announcing actors once', () => {
    const got: InspectionEvent[] = [];
    const observe = commitInspector({ next: (e) => got.push(e) }, silentLogger);
    for (const c of commits()) observe(c);
    const { s0, s1, s2 } = history();
    expect(lines(got)).toEqual(
      lines(
        inspectionEvents('r1', [
          { event: created, before: null, after: s0 },
          { event: startA, before: s0, after: s1 },
          { event: doneA, before: s1, after: s2 },
        ]),
      ),
    );
    expect(got.filter((e) => e.type === '@xstate.actor')).toHaveLength(3);
  });

  it('an observer that throws: every event is still offered, the error logged once', () => {
    const warned: object[] = [];
    const log: Logger = { ...silentLogger, warn: (fields) => warned.push(fields) };
    let calls = 0;
    const observe = commitInspector(() => {
      calls += 1;
      throw new Error('down');
    }, log);
    for (const c of commits()) observe(c);
    expect(calls).toBe(16);
    expect(warned).toHaveLength(1);
    expect(warned[0]).toMatchObject({ runId: 'r1', event: '@xstate.actor' });
  });
});

describe('checkInspectOption', () => {
  it('takes a function or an observer with next; refuses anything else naming inspect', () => {
    const fn = (_e: InspectionEvent) => {};
    const observer = { next: fn };
    expect(checkInspectOption(undefined)).toBeUndefined();
    expect(checkInspectOption(fn)).toBe(fn);
    expect(checkInspectOption(observer)).toBe(observer);
    for (const bad of [null, 1, 'x', {}, { next: 'x' }] as unknown[]) {
      expect(() => checkInspectOption(bad)).toThrow(/inspect: must be an inspection observer/);
    }
  });
});
