/**
 * `buildRunTrace` on hand-written records: granular turns from commits, tool and model calls
 * placed by time (or read from `tool.called` / `model.called` events when a worker records them),
 * an execution under way, a cancelled run, a gate still waiting and a skip by request.
 */
import { describe, expect, it } from 'vitest';
import type { LedgerEntry } from '../../src/persistence/ledger.js';
import type { Reservation } from '../../src/persistence/quota-store.js';
import { buildRunTrace, type RunTraceSources } from '../../src/observability/run-trace.js';

const T = 1_700_000_000_000;

function entry(
  callId: string,
  at: number,
  end: number,
  state = 'SUCCEEDED',
  runs = 1,
): LedgerEntry {
  return {
    callId,
    runId: 'r',
    stepId: 'agent',
    tenantId: 't',
    tool: 'search@1',
    argsHash: 'h',
    args: {},
    state: state as LedgerEntry['state'],
    runs,
    leaseUntil: null,
    receipt: null,
    error: null,
    createdAt: T + at,
    updatedAt: T + end,
    resolution: null,
    seq: at,
  };
}

function reservation(turn: number, at: number, end: number | null): Reservation {
  return {
    id: `res-${turn}-${at}`,
    tenantId: 't',
    runId: 'r',
    stepId: 'agent',
    turn,
    state: (end === null ? 'RESERVED' : 'RECONCILED') as Reservation['state'],
    estimate: {} as Reservation['estimate'],
    reservedTokens: 100,
    reservedMicroUsd: 0,
    charged:
      end === null
        ? null
        : { inputTokens: 10 + turn, outputTokens: 2, tokens: 12 + turn, microUsd: 1500 },
    outcome: end === null ? null : 'usage',
    requestedOutcome: end === null ? null : 'usage',
    createdAt: T + at,
    sentAt: T + at,
    reconciledAt: end === null ? null : T + end,
    seq: at,
  };
}

const base = (over: Partial<RunTraceSources>): RunTraceSources => ({
  runId: 'r',
  planName: 'p',
  tenantId: 't',
  status: 'running',
  createdAt: T,
  traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`,
  plan: [{ id: 'agent', kind: 'agent', dependsOn: [] }],
  steps: [{ stepId: 'agent', status: 'RUNNING', attempt: 2 }],
  started: {},
  events: [],
  ledger: [],
  reservations: [],
  ...over,
});

const ev = (type: string, at: number, fields: Record<string, unknown> = {}) => ({
  type,
  stepId: 'agent',
  at: T + at,
  ...fields,
});

describe('buildRunTrace', () => {
  it('granular turns from commits; calls placed in their attempt and turn; an open turn', () => {
    const trace = buildRunTrace(
      base({
        events: [
          ev('step.started', 10, { attempt: 1, worker: { host: 'h1', pid: 7 } }),
          ev('turn.committed', 50, { attempt: 1, turn: 0 }),
          ev('step.failed', 80, {
            attempt: 1,
            error: { code: 'model_error', message: 'HTTP 500', retryable: true },
          }),
          ev('step.started', 100, { attempt: 2 }),
          ev('turn.committed', 140, { attempt: 2, turn: 1 }),
        ],
        ledger: [entry('c1', 20, 30), entry('c2', 110, 120), entry('c3', 150, 150, 'RUNNING')],
        reservations: [reservation(0, 12, 18), reservation(1, 60, 75), reservation(1, 101, 108)],
      }),
    );
    expect(trace.traceId).toBe('a'.repeat(32));
    expect(trace.end).toBeNull();
    const [a1, a2] = trace.steps[0]!.attempts;
    expect(a1).toMatchObject({
      attempt: 1,
      start: T + 10,
      end: T + 80,
      outcome: 'failed',
      workers: ['h1:7'],
      error: { code: 'model_error', message: 'HTTP 500', retryable: true },
    });
    // A committed turn begins when its model was first asked.
    expect(a1!.turns).toEqual([{ turn: 0, start: T + 12, end: T + 50, outcome: 'committed' }]);
    expect(a1!.modelCalls.map((m) => [m.turn, m.start - T, m.inputTokens, m.costUsd])).toEqual([
      [0, 12, 10, 0.0015],
      [1, 60, 11, 0.0015],
    ]);
    expect(a1!.toolCalls.map((c) => [c.callId, c.turn, c.verdict])).toEqual([
      ['c1', 0, 'executed'],
    ]);
    expect(a2).toMatchObject({ attempt: 2, start: T + 100, end: null, outcome: 'running' });
    expect(a2!.turns).toEqual([
      { turn: 1, start: T + 101, end: T + 140, outcome: 'committed' },
      { turn: 2, start: T + 140, end: null, outcome: 'open' },
    ]);
    expect(a2!.toolCalls.map((c) => [c.callId, c.turn, c.state, c.verdict, c.end])).toEqual([
      ['c2', 1, 'SUCCEEDED', 'executed', T + 120],
      ['c3', 2, 'RUNNING', 'running', null],
    ]);
  });

  it('reads the tool.called, model.called and step.ran events a worker records', () => {
    const worker = { host: 'h2', pid: 9 };
    const trace = buildRunTrace(
      base({
        status: 'succeeded',
        steps: [{ stepId: 'agent', status: 'SUCCEEDED', attempt: 1 }],
        events: [
          ev('step.started', 10, { attempt: 1 }),
          ev('model.called', 30, {
            attempt: 1,
            turn: 0,
            model: 'gpt-x',
            inputTokens: 40,
            outputTokens: 4,
            costUsd: 0.01,
            durationMs: 15,
            charged: 'usage',
            reservationId: 'res-1',
          }),
          ev('tool.called', 32, {
            attempt: 1,
            turn: 0,
            callId: 'c1',
            tool: 'search@1',
            class: 'read_only',
            replayed: false,
            outcome: 'held',
            durationMs: 0.25,
          }),
          ev('tool.called', 33, {
            attempt: 1,
            turn: 0,
            callId: 'c1',
            tool: 'search@1',
            class: 'read_only',
            replayed: false,
            outcome: 'succeeded',
            durationMs: 2,
          }),
          ev('tool.called', 35, {
            attempt: 1,
            turn: 0,
            callId: 'c1',
            tool: 'search@1',
            class: 'read_only',
            replayed: true,
            outcome: 'succeeded',
            durationMs: 0.5,
          }),
          ev('step.succeeded', 40, { attempt: 1 }),
          ev('step.ran', 40, { attempt: 1, worker, startedAt: T + 10, durationMs: 30 }),
          { type: 'run.finished', at: T + 41 },
        ],
        ledger: [entry('c1', 31, 33)],
        reservations: [reservation(0, 16, 30)],
      }),
    );
    const [a] = trace.steps[0]!.attempts;
    expect(trace.end).toBe(T + 41);
    expect(a!.workers).toEqual(['h2:9']);
    expect(a!.modelCalls).toEqual([
      {
        turn: 0,
        model: 'gpt-x',
        start: T + 15,
        end: T + 30,
        inputTokens: 40,
        outputTokens: 4,
        costUsd: 0.01,
        outcome: 'usage',
      },
    ]);
    // Atomic: the turn lasts from its model call to the end of the attempt.
    expect(a!.turns).toEqual([{ turn: 0, start: T + 15, end: T + 40, outcome: 'done' }]);
    expect(a!.toolCalls.map((c) => [c.callId, c.turn, c.verdict, c.executions])).toEqual([
      [
        'c1',
        0,
        'executed',
        [
          { at: T + 32, verdict: 'held', durationMs: 0.25, turn: 0 },
          { at: T + 33, verdict: 'executed', durationMs: 2, turn: 0 },
          { at: T + 35, verdict: 'receipt_replayed', durationMs: 0.5, turn: 0 },
        ],
      ],
    ]);
  });

  it('a turn taken over after its worker died: the takeover, both workers, when the turn began', () => {
    const [w1, w2] = [
      { host: 'h', pid: 1 },
      { host: 'h', pid: 2 },
    ];
    const trace = buildRunTrace(
      base({
        steps: [{ stepId: 'agent', status: 'RUNNING', attempt: 1 }],
        events: [
          ev('step.started', 10, { attempt: 1 }),
          ev('turn.ran', 20, { attempt: 1, turn: 0, worker: w1, startedAt: T + 10 }),
          ev('turn.committed', 20, { attempt: 1, turn: 0 }),
          // w1 took turn 1 at 30 and died; w2 took it again at 900 and committed it.
          ev('turn.takenOver', 900, {
            attempt: 1,
            turn: 1,
            previousWorker: w1,
            previousStartedAt: T + 30,
            worker: w2,
          }),
          ev('turn.ran', 950, { attempt: 1, turn: 1, worker: w2, startedAt: T + 900 }),
          ev('turn.committed', 950, { attempt: 1, turn: 1 }),
        ],
      }),
    );
    const [a] = trace.steps[0]!.attempts;
    expect(a!.workers).toEqual(['h:1', 'h:2']);
    expect(a!.takeovers).toEqual([
      { at: T + 900, turn: 1, previousWorker: 'h:1', previousStartedAt: T + 30, worker: 'h:2' },
    ]);
    expect(a!.turns.map((t) => [t.turn, t.start - T, t.end === null ? null : t.end - T])).toEqual([
      [0, 10, 20],
      [1, 30, 950],
      [2, 950, null],
    ]);
  });

  it("a call recorded before the step first ran (an action's, by another run) was replayed", () => {
    const trace = buildRunTrace(
      base({
        status: 'succeeded',
        steps: [{ stepId: 'agent', status: 'SUCCEEDED', attempt: 1 }],
        events: [ev('step.started', 10, { attempt: 1 }), ev('step.succeeded', 20, { attempt: 1 })],
        ledger: [entry('old', -500, -490), entry('new', 12, 14)],
      }),
    );
    expect(trace.steps[0]!.attempts[0]!.toolCalls.map((c) => [c.callId, c.verdict])).toEqual([
      ['old', 'receipt_replayed'],
      ['new', 'executed'],
    ]);
  });

  it('an execution not yet committed shows from the worker note; a cancel ends open attempts', () => {
    const running = buildRunTrace(
      base({
        started: { agent: `1 0 ${T + 25}` },
        steps: [{ stepId: 'agent', status: 'RUNNING', attempt: 1 }],
      }),
    );
    expect(running.steps[0]!.attempts).toMatchObject([
      { attempt: 1, start: T + 25, end: null, outcome: 'running' },
    ]);
    const cancelled = buildRunTrace(
      base({
        status: 'cancelled',
        steps: [{ stepId: 'agent', status: 'CANCELLED', attempt: 1 }],
        events: [
          ev('step.started', 10, { attempt: 1 }),
          { type: 'run.cancelled', by: 'ana', at: T + 90 },
        ],
      }),
    );
    expect(cancelled.steps[0]!.attempts).toMatchObject([
      { attempt: 1, start: T + 10, end: T + 90, outcome: 'cancelled' },
    ]);
    expect(cancelled.end).toBe(T + 90);
  });

  it('a gate still waiting, and a step skipped by request', () => {
    const trace = buildRunTrace(
      base({
        status: 'waiting',
        plan: [
          { id: 'draft', kind: 'operator', dependsOn: [] },
          { id: 'review', kind: 'human_gate', dependsOn: ['draft'] },
          { id: 'extra', kind: 'operator', dependsOn: [] },
        ],
        steps: [
          { stepId: 'draft', status: 'SUCCEEDED', attempt: 1 },
          { stepId: 'review', status: 'WAITING_APPROVAL', attempt: 0 },
          { stepId: 'extra', status: 'SKIPPED', attempt: 0 },
        ],
        events: [
          { type: 'step.started', stepId: 'draft', attempt: 1, at: T + 5 },
          { type: 'step.succeeded', stepId: 'draft', attempt: 1, at: T + 9 },
          { type: 'step.changed', stepId: 'review', to: 'WAITING_APPROVAL', attempt: 0, at: T + 9 },
          { type: 'step.skipped', stepId: 'extra', reason: 'not needed', by: 'bo', at: T + 12 },
        ],
      }),
    );
    const [draft, review, extra] = trace.steps;
    expect(draft!.attempts.map((a) => a.outcome)).toEqual(['succeeded']);
    expect(review!.attempts).toEqual([]);
    expect(review!.waits).toEqual([
      {
        kind: 'gate',
        start: T + 9,
        end: null,
        decision: null,
        by: null,
        comment: null,
        tool: null,
        callId: null,
      },
    ]);
    expect(extra!.attempts).toEqual([]);
    expect(extra!.skipped).toEqual({ at: T + 12, reason: 'not needed', by: 'bo' });
    expect(trace.end).toBeNull();
  });
});
