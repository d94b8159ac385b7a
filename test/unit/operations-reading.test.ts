import { describe, expect, it } from 'vitest';
import { InputValidationError, RunNotFoundError } from '../../src/errors.js';
import { runSteps, type StepState } from '../../src/machines/kernel.js';
import {
  IDLE_WORK_MS,
  idleWork,
  loadRun,
  pendingApprovals,
  progressOf,
  readLedger,
  readSnapshot,
  readUsage,
  settles,
  stepsAsStarted,
} from '../../src/operations/reading.js';
import { parsePlan } from '../../src/plan/parse-plan.js';
import { traceTransitions, TRACE_T0 } from '../../src/testing/index.js';
import { caught } from '../helpers/caught.js';
import { stubCore } from '../helpers/core-stub.js';

const plan = parsePlan({
  name: 'gated',
  steps: [
    { id: 'send', kind: 'operator', operator: 'op', gate: { approvers: ['ana'], reason: 'money' } },
    { id: 'after', kind: 'operator', operator: 'op', dependsOn: ['send'], riskLevel: 'high' },
  ],
});
const started = traceTransitions(plan, []).snapshot;

/** A raw stream entry of the run's status stream, as Redis returns it. */
function entry(fields: string[]): [string, string[]] {
  return ['1-0', fields];
}

describe('settles: whether a status-stream entry wakes a waiter', () => {
  it('is true for a change of the run status to a settled one', () => {
    for (const to of ['succeeded', 'failed', 'cancelled', 'waiting']) {
      expect(settles(entry(['t', 'run.status', 'd', JSON.stringify({ to })]))).toBe(true);
    }
  });

  it('is false for any other entry, and for one it cannot read', () => {
    expect(settles(entry(['t', 'run.status', 'd', JSON.stringify({ to: 'running' })]))).toBe(false);
    expect(settles(entry(['t', 'step.status', 'd', JSON.stringify({ to: 'failed' })]))).toBe(false);
    expect(settles(entry(['t', 'run.status', 'd', '{not json']))).toBe(false);
    expect(settles(entry(['t', 'run.status']))).toBe(false);
    expect(settles(entry([]))).toBe(false);
  });
});

describe('the parts of a report', () => {
  it('lists what waits for a person, with who may decide', () => {
    const steps = runSteps(started);
    expect(steps[0]?.status).toBe('WAITING_APPROVAL');
    expect(pendingApprovals(steps, plan)).toEqual([
      { stepId: 'send', reason: 'money', approvers: ['ana'], riskLevel: 'low', call: null },
    ]);
  });

  it('shows a READY step as RUNNING when a worker noted it started this attempt', () => {
    const ready: StepState = { ...runSteps(started)[0]!, status: 'READY', attempt: 2 };
    expect(stepsAsStarted([ready], { send: `2 0 ${TRACE_T0} w1` })[0]?.status).toBe('RUNNING');
    expect(stepsAsStarted([ready], { send: `1 0 ${TRACE_T0} w1` })[0]?.status).toBe('READY');
    expect(stepsAsStarted([ready], {})[0]?.status).toBe('READY');
  });

  it('calls due work idle once no worker took it for IDLE_WORK_MS', () => {
    const ready: StepState = { ...runSteps(started)[0]!, status: 'READY', updatedAt: 1000 };
    expect(idleWork([ready], 1000 + IDLE_WORK_MS - 1)).toBeNull();
    expect(idleWork([ready], 1000 + IDLE_WORK_MS)).toEqual({
      stepId: 'send',
      dueSince: 1000,
      idleMs: IDLE_WORK_MS,
    });
    const retry: StepState = { ...ready, status: 'FAILED_RETRYABLE', retryAt: 2000 };
    expect(idleWork([retry], 2000 + IDLE_WORK_MS)?.dueSince).toBe(2000);
  });

  it('parses the progress of each step and leaves out what it cannot read', () => {
    const raw = {
      a: JSON.stringify({ attempt: 1, info: { done: 3 }, at: 5, extra: true }),
      b: '{broken',
    };
    expect(progressOf(raw)).toEqual({ a: { attempt: 1, info: { done: 3 }, at: 5 } });
  });
});

describe('reading a run from the core', () => {
  const meta = { plan, input: null, tenantId: 'acme' };

  it('refuses a run that does not exist with the error the core gives', async () => {
    const core = stubCore({
      stores: {
        store: { tryLoad: () => Promise.resolve(null) },
        notFound: (runId: string) => Promise.resolve(new RunNotFoundError(runId)),
      },
    });
    expect(await caught(loadRun(core, 'r1'))).toBeInstanceOf(RunNotFoundError);
    expect(await caught(readSnapshot(core, 'r1'))).toBeInstanceOf(RunNotFoundError);
    // A run id that is not one is refused before anything is read.
    expect(await caught(readSnapshot(stubCore(), 'a{b}'))).toBeInstanceOf(InputValidationError);
  });

  it("reads a run's usage from the tenant's quota store", async () => {
    const core = stubCore({
      meta: { read: () => Promise.resolve(meta) },
      stores: {
        quota: {
          list: (tenantId: string, runId: string) => Promise.resolve([{ tenantId, runId }]),
          usage: () => Promise.resolve({ spentTokens: 3 }),
        },
      },
    });
    expect(await readUsage(core, 'r1')).toEqual({
      runId: 'r1',
      tenantId: 'acme',
      reservations: [{ tenantId: 'acme', runId: 'r1' }],
      totals: { spentTokens: 3 },
    });
  });

  it("reads the run's own ledger when no step has key inputs", async () => {
    const scopes: string[] = [];
    const core = stubCore({
      meta: { read: () => Promise.resolve(meta) },
      stores: {
        ledger: {
          list: (scope: string) => {
            scopes.push(scope);
            return Promise.resolve([{ callId: 'c1' }]);
          },
        },
      },
    });
    expect(await readLedger(core, 'r1')).toEqual([{ callId: 'c1' }]);
    expect(scopes).toEqual(['r1']);
  });
});
