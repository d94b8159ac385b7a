/**
 * The fallback phase of the step machine (pure transitions), its stored form, the plan checks of
 * `fallback` and `cachePolicy`, and the step a fallback runs as.
 */
import { getAdjacencyMap } from '@xstate/graph';
import { describe, expect, it } from 'vitest';
import { initialTransition, transition, type SnapshotFrom } from 'xstate';
import { fallbackStep } from '../../src/execution/execute-step.js';
import { stepCacheKey } from '../../src/execution/step-cache.js';
import {
  FallbackFailedError,
  StepNonDeterminismError,
  reviveError,
  type SerializedError,
} from '../../src/errors.js';
import { advanceRun, startRun, type RunSnapshot } from '../../src/machines/kernel.js';
import { stepMachine, type StepEvent, type StepInput } from '../../src/machines/step-machine.js';
import {
  compactRunSnapshot,
  expandRunSnapshot,
  type StoredRunSnapshot,
} from '../../src/machines/stored-snapshot.js';
import type { StepReport } from '../../src/machines/types.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { dueJobs } from '../../src/actors/jobs.js';
import { nodesOf } from '../helpers/run-graph.js';

const machine = stepMachine.provide({ actions: { report: () => {} } });
type Snap = SnapshotFrom<typeof machine>;

const retry = {
  maxAttempts: 2,
  initialDelayMs: 100,
  backoffCoefficient: 2,
  maxDelayMs: 1000,
  jitter: 0,
};
const input = (over: Partial<StepInput> = {}): StepInput => ({
  stepId: 's',
  needsApproval: false,
  retry,
  at: 0,
  fallback: true,
  ...over,
});
const at = 5_000;
const primaryError = { name: 'E', code: 'e', message: 'primary broke: "x"', retryable: true };
const fallbackError = { name: 'F', code: 'f', message: 'fallback broke', retryable: true };
const ev = {
  depsMet: { type: 'deps.met', at },
  started: (attempt: number) => ({ type: 'step.started', stepId: 's', attempt, at }) as const,
  failed: (attempt: number, error = primaryError) =>
    ({ type: 'step.failed', stepId: 's', attempt, error, jitterSeed: 1, at }) as const,
  retryDue: (attempt: number) => ({ type: 'retry.due', stepId: 's', attempt, at }) as const,
  succeeded: (attempt: number) =>
    ({ type: 'step.succeeded', stepId: 's', attempt, output: { ok: attempt }, at }) as const,
} as const;

function step(snap: Snap, event: StepEvent): { snap: Snap; reports: StepReport[] } {
  const [next, actions] = transition(machine, snap, event);
  const reports = actions.filter((a) => a.type === 'report').map((a) => a.params as StepReport);
  return { snap: next, reports };
}
function run(events: StepEvent[], over: Partial<StepInput> = {}): Snap {
  return events.reduce((s, e) => step(s, e).snap, initialTransition(machine, input(over))[0]);
}

describe('step machine: the fallback phase', () => {
  it('adds exactly the edges into the fallback, and none out of a final state', () => {
    const finalError = { ...primaryError, retryable: false };
    const events = (s: Snap): StepEvent[] => {
      const n = s.context.attempt;
      return [
        ev.depsMet,
        ev.started(n),
        ev.failed(n),
        ev.failed(n, finalError),
        ev.failed(n - 1, finalError),
        ev.retryDue(n + 1),
        ev.succeeded(n),
      ];
    };
    const edgesOf = (fallback: boolean): Set<string> => {
      const edges = new Set<string>();
      const map = getAdjacencyMap(machine, {
        input: input({ fallback }),
        events,
        serializeState: (s) => JSON.stringify([s.value, s.context]),
      });
      for (const { state, edges: out } of nodesOf<Snap, StepEvent>(map)) {
        for (const { event, next } of out) {
          if (JSON.stringify(state) === JSON.stringify(next)) continue;
          const phase = (x: Snap) => (x.context.fallback?.active === true ? '(fallback)' : '');
          const label =
            event.type === 'step.failed'
              ? `step.failed(${event.error.retryable ? 'retryable' : 'final'})`
              : event.type;
          edges.add(
            `${String(state.value)}${phase(state)} --${label}--> ${String(next.value)}${phase(next)}`,
          );
        }
      }
      return edges;
    };
    const without = edgesOf(false);
    const withFallback = edgesOf(true);
    const added = [...withFallback].filter((e) => !without.has(e)).sort();
    expect(added).toEqual(
      [
        'READY --step.failed(final)--> READY(fallback)',
        'READY --step.failed(retryable)--> READY(fallback)',
        'READY(fallback) --step.failed(final)--> FAILED_FINAL(fallback)',
        'READY(fallback) --step.failed(retryable)--> FAILED_FINAL(fallback)',
        'READY(fallback) --step.started--> RUNNING(fallback)',
        'READY(fallback) --step.succeeded--> SUCCEEDED(fallback)',
        'RUNNING --step.failed(final)--> READY(fallback)',
        'RUNNING --step.failed(retryable)--> READY(fallback)',
        'RUNNING(fallback) --step.failed(final)--> FAILED_FINAL(fallback)',
        'RUNNING(fallback) --step.failed(retryable)--> FAILED_FINAL(fallback)',
        'RUNNING(fallback) --step.succeeded--> SUCCEEDED(fallback)',
      ].sort(),
    );
    // With a fallback, the primary's final failure never ends the step.
    const removed = [...without].filter((e) => !withFallback.has(e)).sort();
    expect(removed).toEqual([
      'READY --step.failed(final)--> FAILED_FINAL',
      'READY --step.failed(retryable)--> FAILED_FINAL',
      'RUNNING --step.failed(final)--> FAILED_FINAL',
      'RUNNING --step.failed(retryable)--> FAILED_FINAL',
    ]);
  });

  it('a step with a fallback starts with the phase inactive; one without has none', () => {
    expect(run([]).context.fallback).toEqual({ active: false, primaryError: null });
    expect(run([], { fallback: false }).context.fallback).toBeNull();
  });

  it('retries the primary first; its final failure makes the fallback the next attempt (READY)', () => {
    const retried = run([ev.depsMet, ev.started(1), ev.failed(1)]);
    expect(retried.value).toBe('FAILED_RETRYABLE');
    expect(retried.context.fallback?.active).toBe(false);

    const before = run([ev.depsMet, ev.started(1), ev.failed(1), ev.retryDue(2), ev.started(2)]);
    const { snap, reports } = step(before, ev.failed(2));
    expect(snap.value).toBe('READY');
    expect(snap.context).toMatchObject({
      attempt: 3,
      fallback: { active: true, primaryError },
      error: primaryError,
      retryAt: null,
    });
    // READY's entry plans the fallback's attempt.
    expect(reports).toEqual([
      expect.objectContaining({
        status: 'READY',
        attempt: 3,
        planned: { type: 'step.execute', stepId: 's', attempt: 3 },
      }),
    ]);
  });

  it('a non-retryable primary error goes to the fallback at once', () => {
    const final = { ...primaryError, retryable: false };
    const snap = run([ev.depsMet, ev.started(1), ev.failed(1, final)]);
    expect(snap.value).toBe('READY');
    expect(snap.context).toMatchObject({
      attempt: 2,
      fallback: { active: true, primaryError: final },
    });
  });

  it('a failure fed to a READY step directly re-enters READY and plans the fallback', () => {
    const { snap, reports } = step(
      run([ev.depsMet]),
      ev.failed(1, { ...primaryError, retryable: false }),
    );
    expect(snap.value).toBe('READY');
    expect(reports.map((r) => r.planned)).toEqual([
      { type: 'step.execute', stepId: 's', attempt: 2 },
    ]);
  });

  it('the fallback runs once: its failure, even retryable, is final with reason fallback_failed', () => {
    const fb = run([
      ev.depsMet,
      ev.started(1),
      ev.failed(1, { ...primaryError, retryable: false }),
    ]);
    const { snap } = step(step(fb, ev.started(2)).snap, ev.failed(2, fallbackError));
    expect(snap.value).toBe('FAILED_FINAL');
    expect(snap.context).toMatchObject({
      attempt: 2,
      reason: 'fallback_failed',
      error: fallbackError,
    });
  });

  it('the fallback succeeding ends the step with its output', () => {
    const fb = run([
      ev.depsMet,
      ev.started(1),
      ev.failed(1, { ...primaryError, retryable: false }),
    ]);
    const { snap } = step(step(fb, ev.started(2)).snap, ev.succeeded(2));
    expect(snap.value).toBe('SUCCEEDED');
    expect(snap.context).toMatchObject({ output: { ok: 2 }, fallback: { active: true } });
  });

  it('a stale failure of the primary never starts the fallback twice', () => {
    const fb = run([
      ev.depsMet,
      ev.started(1),
      ev.failed(1, { ...primaryError, retryable: false }),
    ]);
    const { snap } = step(fb, ev.failed(1, { ...primaryError, retryable: false }));
    expect(snap).toEqual(fb);
  });

  it('a step without a fallback fails finally as before', () => {
    const snap = run(
      [ev.depsMet, ev.started(1), ev.failed(1, { ...primaryError, retryable: false })],
      {
        fallback: false,
      },
    );
    expect(snap.value).toBe('FAILED_FINAL');
    expect(snap.context.reason).toBe('non_retryable_error');
  });

  it('a cache hit is noted on the step, for the current attempt only', () => {
    const hit = {
      type: 'step.cacheHit',
      stepId: 's',
      attempt: 1,
      sourceRunId: 'r0',
      storedAt: 42,
      cacheClass: 'external',
      provenance: 'api.example',
      at,
    } as const;
    const snap = step(run([ev.depsMet, ev.started(1)]), hit).snap;
    expect(snap.context.cachedFrom).toEqual({
      runId: 'r0',
      storedAt: 42,
      cacheClass: 'external',
      provenance: 'api.example',
    });
    // A hit of another attempt is not noted: the step holds no `cachedFrom` at all.
    const other = step(run([ev.depsMet]), { ...hit, attempt: 2 }).snap.context;
    expect('cachedFrom' in other).toBe(false);
  });
});

const planInput: PlanInput = {
  name: 'p',
  steps: [
    {
      id: 'g',
      kind: 'agent',
      agent: 'researcher',
      mode: 'granular',
      fallback: { operator: 'backup' },
      retry: { maxAttempts: 1 },
    },
  ],
};

describe('the fallback phase in a run', () => {
  it('survives the stored form, and an old stored step without the field reads as none', () => {
    const plan = parsePlan(planInput);
    let snapshot: RunSnapshot = startRun(plan, { runId: 'run-1', at: 1000 }).snapshot;
    for (const e of [
      { type: 'step.started', stepId: 'g', attempt: 1, at: 1001 },
      {
        type: 'step.failed',
        stepId: 'g',
        attempt: 1,
        error: primaryError,
        jitterSeed: 0,
        at: 1002,
      },
    ] as const) {
      snapshot = advanceRun(snapshot, e).snapshot;
    }
    const context = snapshot.children['g']!.snapshot.context;
    expect(context.fallback).toEqual({ active: true, primaryError });
    const round = expandRunSnapshot(
      JSON.parse(JSON.stringify(compactRunSnapshot(snapshot))) as StoredRunSnapshot,
    );
    expect(round).toEqual(snapshot);

    // The fallback of a granular step runs as a step job, not a turn.
    expect(dueJobs('run-1', snapshot, 2000).map((j) => [j.name, j.opts.jobId])).toEqual([
      ['step', expect.stringContaining('g')],
    ]);

    const stored = compactRunSnapshot(snapshot);
    delete stored.s['g']!['fallback'];
    expect(expandRunSnapshot(stored).children['g']!.snapshot.context.fallback).toBeNull();
  });
});

describe('a resumed run', () => {
  it('starts a step whose fallback failed from its primary again, attempts going on', () => {
    const plan = parsePlan({
      name: 'p',
      steps: [{ id: 'a', kind: 'operator', operator: 'o', fallback: { operator: 'b' } }],
    });
    const final = { ...primaryError, retryable: false };
    let snapshot: RunSnapshot = startRun(plan, { runId: 'run-2', at: 1000 }).snapshot;
    for (const e of [
      { type: 'step.failed', stepId: 'a', attempt: 1, error: final, jitterSeed: 0, at: 1001 },
      {
        type: 'step.failed',
        stepId: 'a',
        attempt: 2,
        error: fallbackError,
        jitterSeed: 0,
        at: 1002,
      },
      { type: 'run.resumed', by: 'ana', at: 1003 },
    ] as const) {
      snapshot = advanceRun(snapshot, e).snapshot;
    }
    const step = snapshot.children['a']!.snapshot;
    expect(step.value).toBe('READY');
    expect(step.context).toMatchObject({
      attempt: 3,
      fallback: { active: false, primaryError: null },
    });
  });
});

describe('plan checks of fallback and cachePolicy', () => {
  const base = { name: 'p' };
  it('accepts a fallback on operator and agent steps, defaults allowCacheHit to false', () => {
    const plan = parsePlan({
      ...base,
      steps: [
        { id: 'a', kind: 'operator', operator: 'x', fallback: { agent: 'w' } },
        {
          id: 'b',
          kind: 'agent',
          agent: 'w',
          fallback: { operator: 'x' },
          cachePolicy: { class: 'stable_nondeterministic' },
        },
      ],
    });
    expect(plan.steps[1]!.cachePolicy).toEqual({
      class: 'stable_nondeterministic',
      allowCacheHit: false,
    });
  });

  it.each([
    [
      'a fallback on a policy check',
      { id: 'a', kind: 'policy_check', policy: 'p', fallback: { operator: 'x' } },
      'steps[0].fallback: only operator and agent steps take a fallback',
    ],
    [
      'a fallback naming both',
      { id: 'a', kind: 'operator', operator: 'o', fallback: { operator: 'x', agent: 'y' } },
      'steps[0].fallback',
    ],
    [
      'a cache on a human gate',
      { id: 'a', kind: 'human_gate', cachePolicy: { class: 'deterministic' } },
      'steps[0].cachePolicy: only operator and agent steps are cached',
    ],
    [
      'a cache on a granular agent step',
      {
        id: 'a',
        kind: 'agent',
        agent: 'w',
        mode: 'granular',
        cachePolicy: { class: 'deterministic' },
      },
      'granular agent steps are not cached',
    ],
  ])('refuses %s', (_what, stepInput, message) => {
    expect(() => parsePlan({ ...base, steps: [stepInput] })).toThrow(message);
  });
});

describe('the step a fallback runs as', () => {
  const plan = parsePlan({
    name: 'p',
    steps: [
      {
        id: 'a',
        kind: 'operator',
        operator: 'primary',
        input: { q: 1 },
        timeoutMs: 500,
        cachePolicy: { class: 'deterministic' },
        fallback: { agent: 'writer' },
      },
      { id: 'b', kind: 'agent', agent: 'w', maxTurns: 3, fallback: { operator: 'backup' } },
      { id: 'c', kind: 'operator', operator: 'o' },
    ],
  });

  it('keeps the step (id, input, timeout) with the fallback in place of the primary, uncached', () => {
    expect(fallbackStep(plan.steps[0]!)).toMatchObject({
      id: 'a',
      kind: 'agent',
      agent: 'writer',
      mode: 'atomic',
      maxTurns: 20,
      input: { q: 1 },
      timeoutMs: 500,
      cachePolicy: { class: 'none' },
    });
    const op = fallbackStep(plan.steps[1]!)!;
    expect(op).toMatchObject({ id: 'b', kind: 'operator', operator: 'backup' });
    expect(op).not.toHaveProperty('maxTurns');
    expect(fallbackStep(plan.steps[2]!)).toBeNull();
    const granular = parsePlan({
      name: 'p',
      steps: [
        {
          id: 'g',
          kind: 'agent',
          agent: 'w',
          mode: 'granular',
          enforceIdempotency: true,
          maxTurns: 4,
          fallback: { agent: 'v' },
        },
      ],
    }).steps[0]!;
    expect(fallbackStep(granular)).toMatchObject({
      kind: 'agent',
      agent: 'v',
      mode: 'atomic',
      maxTurns: 4,
      enforceIdempotency: false,
    });
  });
});

describe('cache keys and errors', () => {
  it('a cache key depends on identity, input and dependencies, not on key order', () => {
    const id = { kind: 'operator', name: 'w', version: '1' };
    const k = stepCacheKey(id, { a: 1, b: 2 }, { up: [1] });
    expect(stepCacheKey(id, { b: 2, a: 1 }, { up: [1] })).toBe(k);
    expect(stepCacheKey({ ...id, version: '2' }, { a: 1, b: 2 }, { up: [1] })).not.toBe(k);
    expect(stepCacheKey(id, { a: 1, b: 3 }, { up: [1] })).not.toBe(k);
    expect(stepCacheKey(id, { a: 1, b: 2 }, { up: [2] })).not.toBe(k);
  });

  it('NonDeterminismError of a step and FallbackFailedError survive JSON with name and code', () => {
    const nd = reviveError(
      JSON.parse(
        JSON.stringify(new StepNonDeterminismError('s', 'r0', 'a'.repeat(64), 'b'.repeat(64))),
      ) as SerializedError,
    );
    expect([nd.name, nd.code, nd.retryable]).toEqual([
      'NonDeterminismError',
      'non_determinism',
      false,
    ]);
    const ff = new FallbackFailedError('s', primaryError, fallbackError).toJSON();
    expect([ff.name, ff.code, ff.retryable]).toEqual([
      'FallbackFailedError',
      'fallback_failed',
      false,
    ]);
    expect(ff.message).toContain('primary broke: "x"');
    expect(ff.message).toContain('fallback broke');
  });
});
