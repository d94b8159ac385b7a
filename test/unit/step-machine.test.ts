import { getAdjacencyMap } from '@xstate/graph';
import { describe, expect, it } from 'vitest';
import { initialTransition, transition, type SnapshotFrom } from 'xstate';
import { stepMachine, type StepEvent, type StepInput } from '../../src/machines/step-machine.js';
import type { StepReport } from '../../src/machines/types.js';
import { nodesOf } from '../helpers/run-graph.js';

// The real `report` action sends to a parent; here it is a plain action so that the pure
// `transition()` returns it (with its params) instead of failing for want of a parent.
const machine = stepMachine.provide({ actions: { report: () => {} } });
type Snap = SnapshotFrom<typeof machine>;

const retry = {
  maxAttempts: 3,
  initialDelayMs: 1000,
  backoffCoefficient: 2,
  maxDelayMs: 60_000,
  jitter: 0,
};
const input = (over: Partial<StepInput> = {}): StepInput => ({
  stepId: 's',
  needsApproval: false,
  retry,
  at: 0,
  ...over,
});

const retryableError = { name: 'E', code: 'e', message: 'flaky', retryable: true };
const finalError = { name: 'E', code: 'e', message: 'broken', retryable: false };
const at = 10_000;

const ev = {
  depsMet: { type: 'deps.met', at },
  depsFailed: { type: 'deps.failed', causeStepId: 'up', at },
  approve: { type: 'gate.approved', stepId: 's', by: 'ana', comment: 'ok', at },
  reject: { type: 'gate.rejected', stepId: 's', by: 'bo', comment: 'no', at },
  succeeded: (attempt: number) =>
    ({ type: 'step.succeeded', stepId: 's', attempt, output: { n: attempt }, at }) as const,
  failed: (attempt: number, retryable = true) =>
    ({
      type: 'step.failed',
      stepId: 's',
      attempt,
      error: retryable ? retryableError : finalError,
      jitterSeed: 42,
      at,
    }) as const,
  skippedRunning: (attempt: number) =>
    ({ type: 'step.skipped', stepId: 's', attempt, reason: 'nothing to do', at }) as const,
  skip: { type: 'step.skipped', stepId: 's', reason: 'not needed', at },
  retryDue: (attempt: number) => ({ type: 'retry.due', stepId: 's', attempt, at }) as const,
  cancel: { type: 'step.cancel', reason: 'run_cancelled', at },
  started: (attempt: number) => ({ type: 'step.started', stepId: 's', attempt, at }) as const,
  askCall: (attempt: number) =>
    ({
      type: 'tool.approvalRequested',
      stepId: 's',
      attempt,
      callId: 'c1',
      tool: 'pay@1',
      args: { cents: 5 },
      at,
    }) as const,
} as const;

function start(over: Partial<StepInput> = {}): Snap {
  return initialTransition(machine, input(over))[0];
}

function step(snap: Snap, event: StepEvent): { snap: Snap; reports: StepReport[] } {
  const [next, actions] = transition(machine, snap, event);
  const reports = actions.filter((a) => a.type === 'report').map((a) => a.params as StepReport);
  return { snap: next, reports };
}

function run(events: StepEvent[], over: Partial<StepInput> = {}): Snap {
  return events.reduce((s, e) => step(s, e).snap, start(over));
}

describe('step machine: every edge', () => {
  it('the edges xstate enumerates are exactly the designed ones', () => {
    // Every event the machine could see, with attempts 1..3 and stale ones, from every state.
    const events = (s: Snap): StepEvent[] => {
      const n = s.context.attempt;
      return [
        ev.depsMet,
        ev.depsFailed,
        ev.approve,
        ev.reject,
        ev.succeeded(n),
        ev.succeeded(n + 1),
        ev.failed(n, true),
        ev.failed(n, false),
        ev.skippedRunning(n),
        ev.skip,
        ev.retryDue(n + 1),
        ev.retryDue(n),
        ev.cancel,
        ev.started(n),
        // One pause per path keeps the graph finite (each pause is a new execution).
        ...(s.context.pauses === 0 ? [ev.askCall(n)] : []),
      ];
    };
    const edges = new Set<string>();
    for (const needsApproval of [false, true]) {
      const map = getAdjacencyMap(machine, {
        input: input({ needsApproval }),
        events,
        serializeState: (s) => JSON.stringify([s.value, s.context]),
      });
      for (const { state, edges: out } of nodesOf<Snap, StepEvent>(map)) {
        for (const { event, next } of out) {
          const from = state.value;
          const to = next.value;
          if (from === to && JSON.stringify(state) === JSON.stringify(next)) continue; // ignored
          const label =
            event.type === 'step.failed'
              ? `step.failed(${event.error.retryable ? 'retryable' : 'final'})`
              : event.type === 'step.skipped'
                ? `step.skipped(${'attempt' in event && event.attempt !== undefined ? 'attempt' : 'request'})`
                : event.type;
          edges.add(`${from} --${label}--> ${to}`);
        }
      }
    }
    expect([...edges].sort()).toEqual(
      [
        'PENDING --deps.met--> READY',
        'PENDING --deps.met--> WAITING_APPROVAL', // gated
        'PENDING --deps.failed--> CANCELLED',
        'PENDING --step.skipped(request)--> SKIPPED',
        'PENDING --step.cancel--> CANCELLED',
        'READY --step.started--> RUNNING',
        // A result fed to a READY step directly (the kernel driven by hand).
        'READY --step.succeeded--> SUCCEEDED',
        'READY --step.failed(retryable)--> FAILED_RETRYABLE',
        'READY --step.failed(retryable)--> FAILED_FINAL',
        'READY --step.failed(final)--> FAILED_FINAL',
        'READY --step.skipped(attempt)--> SKIPPED',
        'READY --step.skipped(request)--> SKIPPED',
        'READY --step.cancel--> CANCELLED',
        'WAITING_APPROVAL --gate.approved--> READY', // the gate, or the pending tool call
        'WAITING_APPROVAL --gate.rejected--> FAILED_FINAL', // the gate
        'WAITING_APPROVAL --gate.rejected--> READY', // the pending tool call: the attempt goes on
        'WAITING_APPROVAL --step.skipped(request)--> SKIPPED',
        'WAITING_APPROVAL --step.cancel--> CANCELLED',
        'RUNNING --step.succeeded--> SUCCEEDED',
        'RUNNING --step.failed(retryable)--> FAILED_RETRYABLE',
        'RUNNING --step.failed(retryable)--> FAILED_FINAL', // attempts exhausted
        'RUNNING --step.failed(final)--> FAILED_FINAL',
        'RUNNING --step.skipped(attempt)--> SKIPPED',
        'RUNNING --step.skipped(request)--> SKIPPED',
        'RUNNING --tool.approvalRequested--> WAITING_APPROVAL',
        'RUNNING --step.cancel--> CANCELLED',
        'FAILED_RETRYABLE --retry.due--> READY',
        'FAILED_RETRYABLE --step.skipped(request)--> SKIPPED',
        'FAILED_RETRYABLE --step.cancel--> CANCELLED',
      ].sort(),
    );
  });

  it('PENDING → READY on deps.met: attempt 1 is numbered and planned, and waits for a worker', () => {
    const { snap, reports } = step(start(), ev.depsMet);
    expect(snap.value).toBe('READY');
    expect(snap.context.attempt).toBe(1);
    expect(reports).toEqual([
      {
        stepId: 's',
        status: 'READY',
        attempt: 1,
        planned: { type: 'step.execute', stepId: 's', attempt: 1 },
        at,
      },
    ]);
  });

  it('READY → RUNNING when a worker starts the attempt; nothing more is planned', () => {
    const ready = run([ev.depsMet]);
    expect(step(ready, ev.started(2)).snap).toEqual(ready);
    const { snap, reports } = step(ready, ev.started(1));
    expect(snap.value).toBe('RUNNING');
    expect(reports).toEqual([{ stepId: 's', status: 'RUNNING', attempt: 1, planned: null, at }]);
  });

  it('PENDING → WAITING_APPROVAL when gated; approval is requested, no attempt starts', () => {
    const { snap, reports } = step(start({ needsApproval: true }), ev.depsMet);
    expect(snap.value).toBe('WAITING_APPROVAL');
    expect(snap.context.attempt).toBe(0);
    expect(reports.map((r) => r.planned)).toEqual([{ type: 'step.requestApproval', stepId: 's' }]);
  });

  it('PENDING → CANCELLED on deps.failed, naming the failed upstream step', () => {
    const { snap, reports } = step(start(), ev.depsFailed);
    expect(snap.value).toBe('CANCELLED');
    expect(snap.context).toMatchObject({
      reason: 'upstream_failed',
      causeStepId: 'up',
      attempt: 0,
    });
    expect(reports).toEqual([{ stepId: 's', status: 'CANCELLED', attempt: 0, planned: null, at }]);
  });

  it('PENDING → SKIPPED on a skip request; a skip naming an attempt is ignored', () => {
    expect(step(start(), ev.skip).snap.value).toBe('SKIPPED');
    expect(step(start(), ev.skip).snap.context.reason).toBe('not needed');
    expect(step(start(), ev.skippedRunning(1)).snap.value).toBe('PENDING');
  });

  it('PENDING → CANCELLED on cancel, with nothing to abort', () => {
    const { snap, reports } = step(start(), ev.cancel);
    expect(snap.value).toBe('CANCELLED');
    expect(reports[0]?.planned).toBeNull();
  });

  it('WAITING_APPROVAL → READY on approval, recording who, when and why', () => {
    const { snap, reports } = step(run([ev.depsMet], { needsApproval: true }), ev.approve);
    expect(snap.value).toBe('READY');
    expect(snap.context.approval).toEqual({ by: 'ana', at, comment: 'ok' });
    expect(reports.map((r) => r.planned)).toEqual([
      { type: 'step.execute', stepId: 's', attempt: 1 },
    ]);
  });

  it('WAITING_APPROVAL → FAILED_FINAL on rejection, reason approval_rejected', () => {
    const { snap } = step(run([ev.depsMet], { needsApproval: true }), ev.reject);
    expect(snap.value).toBe('FAILED_FINAL');
    expect(snap.context).toMatchObject({
      reason: 'approval_rejected',
      rejection: { by: 'bo', at, comment: 'no' },
      attempt: 0,
    });
  });

  it('WAITING_APPROVAL → SKIPPED on a skip request, → CANCELLED on cancel', () => {
    const waiting = run([ev.depsMet], { needsApproval: true });
    expect(step(waiting, ev.skip).snap.value).toBe('SKIPPED');
    expect(step(waiting, ev.cancel).snap.value).toBe('CANCELLED');
  });

  it('RUNNING → SUCCEEDED on the current attempt; a stale or future attempt is ignored', () => {
    const running = run([ev.depsMet, ev.started(1)]);
    const { snap } = step(running, ev.succeeded(1));
    expect(snap.value).toBe('SUCCEEDED');
    expect(snap.context.output).toEqual({ n: 1 });
    expect(step(running, ev.succeeded(2)).snap).toEqual(running);
    expect(step(running, ev.succeeded(0)).snap.value).toBe('RUNNING');
  });

  it('RUNNING → FAILED_RETRYABLE on a retryable failure, retry planned at now + backoff', () => {
    const { snap, reports } = step(run([ev.depsMet, ev.started(1)]), ev.failed(1));
    expect(snap.value).toBe('FAILED_RETRYABLE');
    expect(snap.context.retryAt).toBe(at + 1000);
    expect(reports.map((r) => r.planned)).toEqual([
      { type: 'step.scheduleRetry', stepId: 's', attempt: 2, at: at + 1000, delayMs: 1000 },
    ]);
  });

  it('the retry delay grows by the coefficient, honours retry-after, and jitter comes from the seed', () => {
    const second = run([ev.depsMet, ev.failed(1), ev.retryDue(2)]);
    expect(step(second, ev.failed(2)).snap.context.retryAt).toBe(at + 2000);
    const slow = { ...ev.failed(1), error: { ...retryableError, retryAfterMs: 5000 } };
    expect(step(run([ev.depsMet]), slow).snap.context.retryAt).toBe(at + 5000);
    const jittery = run([ev.depsMet], { retry: { ...retry, jitter: 0.5 } });
    const a = step(jittery, ev.failed(1)).snap.context.retryAt;
    const b = step(jittery, ev.failed(1)).snap.context.retryAt;
    const c = step(jittery, { ...ev.failed(1), jitterSeed: 7 }).snap.context.retryAt;
    expect(a).toBe(b);
    expect(a).not.toBe(c);
    expect(a).toBeGreaterThanOrEqual(at + 500);
    expect(a).toBeLessThanOrEqual(at + 1000);
  });

  it('RUNNING → FAILED_FINAL when the last attempt fails retryably: retries_exhausted', () => {
    const third = run([ev.depsMet, ev.failed(1), ev.retryDue(2), ev.failed(2), ev.retryDue(3)]);
    expect(third.context.attempt).toBe(3);
    const { snap } = step(third, ev.failed(3));
    expect(snap.value).toBe('FAILED_FINAL');
    expect(snap.context.reason).toBe('retries_exhausted');
  });

  it('RUNNING → FAILED_FINAL on a non-retryable failure, keeping the error', () => {
    const { snap } = step(run([ev.depsMet]), ev.failed(1, false));
    expect(snap.value).toBe('FAILED_FINAL');
    expect(snap.context).toMatchObject({ reason: 'non_retryable_error', error: finalError });
  });

  it('RUNNING: a failure of another attempt is ignored', () => {
    const running = run([ev.depsMet, ev.started(1)]);
    expect(step(running, ev.failed(2)).snap).toEqual(running);
  });

  it('RUNNING → SKIPPED when the running attempt says there is nothing to do', () => {
    const running = run([ev.depsMet, ev.started(1)]);
    const own = step(running, ev.skippedRunning(1));
    expect(own.snap.value).toBe('SKIPPED');
    expect(own.reports.map((r) => r.planned)).toEqual([null]);
  });

  it('READY or RUNNING → SKIPPED by request plans the abort of the attempt that may be running', () => {
    for (const from of [run([ev.depsMet]), run([ev.depsMet, ev.started(1)])]) {
      const { snap, reports } = step(from, ev.skip);
      expect(snap.value).toBe('SKIPPED');
      expect(snap.context.reason).toBe('not needed');
      expect(reports.map((r) => r.planned)).toEqual([
        { type: 'step.abort', stepId: 's', attempt: 1 },
      ]);
    }
  });

  it('READY → CANCELLED on cancel plans the abort of the attempt a worker may be executing', () => {
    const { snap, reports } = step(run([ev.depsMet]), ev.cancel);
    expect(snap.value).toBe('CANCELLED');
    expect(reports.map((r) => r.planned)).toEqual([
      { type: 'step.abort', stepId: 's', attempt: 1 },
    ]);
  });

  it('RUNNING → CANCELLED on cancel plans the abort of the running attempt', () => {
    const { snap, reports } = step(run([ev.depsMet, ev.started(1)]), ev.cancel);
    expect(snap.value).toBe('CANCELLED');
    expect(reports.map((r) => r.planned)).toEqual([
      { type: 'step.abort', stepId: 's', attempt: 1 },
    ]);
  });

  it('FAILED_RETRYABLE → READY when the next attempt is due; another attempt number is ignored', () => {
    const failed = run([ev.depsMet, ev.failed(1)]);
    const { snap, reports } = step(failed, ev.retryDue(2));
    expect(snap.value).toBe('READY');
    expect(snap.context).toMatchObject({ attempt: 2, retryAt: null });
    expect(reports.map((r) => r.planned)).toEqual([
      { type: 'step.execute', stepId: 's', attempt: 2 },
    ]);
    expect(step(failed, ev.retryDue(1)).snap).toEqual(failed);
    expect(step(failed, ev.retryDue(3)).snap).toEqual(failed);
  });

  it('FAILED_RETRYABLE → SKIPPED on a skip request, → CANCELLED on cancel', () => {
    const failed = run([ev.depsMet, ev.failed(1)]);
    expect(step(failed, ev.skip).snap.value).toBe('SKIPPED');
    expect(step(failed, ev.cancel).snap.value).toBe('CANCELLED');
    expect(step(failed, ev.cancel).snap.context.retryAt).toBeNull();
  });

  it('a gated step approved once does not ask again after a retry', () => {
    const snap = run([ev.depsMet, ev.approve, ev.failed(1), ev.retryDue(2)], {
      needsApproval: true,
    });
    expect(snap.value).toBe('READY');
    expect(snap.context.attempt).toBe(2);
  });

  it('a tool call waiting for approval: approved, the same attempt resumes as a new execution', () => {
    const running = run([ev.depsMet, ev.started(1)]);
    const held = step(running, ev.askCall(1));
    expect(held.snap.value).toBe('WAITING_APPROVAL');
    expect(held.snap.context.pendingCall).toEqual({
      callId: 'c1',
      tool: 'pay@1',
      args: { cents: 5 },
      toolCallId: null,
      turn: null,
      at,
    });
    expect(held.reports.map((r) => r.planned)).toEqual([
      { type: 'step.requestApproval', stepId: 's' },
    ]);
    // A decision naming another call is not taken.
    expect(step(held.snap, { ...ev.approve, callId: 'c2' }).snap).toEqual(held.snap);
    const { snap, reports } = step(held.snap, { ...ev.approve, callId: 'c1' });
    expect(snap.value).toBe('READY');
    expect(snap.context).toMatchObject({
      attempt: 1,
      pauses: 1,
      pendingCall: null,
      approval: null,
      callDecisions: [{ callId: 'c1', attempt: 1, approved: true, by: 'ana', at, comment: 'ok' }],
    });
    expect(reports.map((r) => r.planned)).toEqual([
      { type: 'step.execute', stepId: 's', attempt: 1, pause: 1 },
    ]);
  });

  it('a tool call rejected: the attempt goes on (the execution is told); the next attempt forgets it', () => {
    const held = run([ev.depsMet, ev.started(1), ev.askCall(1)]);
    const { snap } = step(held, ev.reject);
    expect(snap.value).toBe('READY');
    expect(snap.context.rejection).toBeNull();
    expect(snap.context.callDecisions).toEqual([
      { callId: 'c1', attempt: 1, approved: false, by: 'bo', at, comment: 'no' },
    ]);
    const next = [ev.started(1), ev.failed(1), ev.retryDue(2)].reduce(
      (s, e) => step(s, e).snap,
      snap,
    );
    expect(next.value).toBe('READY');
    expect(next.context).toMatchObject({ attempt: 2, pauses: 0, callDecisions: null });
  });

  it('a tool call is held only by the current attempt while RUNNING', () => {
    const ready = run([ev.depsMet]);
    expect(step(ready, ev.askCall(1)).snap).toEqual(ready);
    const running = run([ev.depsMet, ev.started(1)]);
    expect(step(running, ev.askCall(2)).snap).toEqual(running);
  });

  it('final states stay final under every event', () => {
    const finals: Snap[] = [
      run([ev.depsMet, ev.succeeded(1)]),
      run([ev.depsMet, ev.failed(1, false)]),
      run([ev.skip]),
      run([ev.cancel]),
    ];
    const all: StepEvent[] = [
      ev.depsMet,
      ev.depsFailed,
      ev.approve,
      ev.reject,
      ev.succeeded(1),
      ev.failed(1),
      ev.failed(1, false),
      ev.skippedRunning(1),
      ev.skip,
      ev.retryDue(2),
      ev.cancel,
      ev.started(1),
      ev.askCall(1),
    ];
    expect(finals.map((s) => s.value)).toEqual([
      'SUCCEEDED',
      'FAILED_FINAL',
      'SKIPPED',
      'CANCELLED',
    ]);
    for (const final of finals) {
      expect(final.status).toBe('done');
      for (const e of all) {
        const { snap, reports } = step(final, e);
        expect(snap.value).toBe(final.value);
        expect(snap.context).toEqual(final.context);
        expect(reports).toEqual([]);
      }
    }
  });
});
