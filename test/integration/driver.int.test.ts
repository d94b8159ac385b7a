/**
 * The BullMQ driver in one process: retries through delayed jobs, budgets, gates, request keys,
 * cancellation and start-up recovery, checked against the runs' event streams and against what the
 * operators really executed.
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { z } from 'zod';
import { InputValidationError, StepNotWaitingError } from '../../src/errors.js';
import type { OperatorContext } from '../../src/execution/execute-step.js';
import type { JsonValue } from '../../src/internal/json.js';
import type { PlanInput } from '../../src/plan/schema.js';
import type { StoredRunEvent } from '../../src/persistence/snapshot-store.js';
import { createRuntime, type Runtime, runtimeCore } from '../../src/runtime.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import type { StepOutcome } from '../../src/schemas/outcomes.js';
import { defineTool } from '../../src/tools/define-tool.js';
import { retryJobId, stepJobId } from '../../src/actors/jobs.js';
import { ledgerCallId } from '../../src/persistence/ledger-ids.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';

interface Call {
  runId: string;
  stepId: string;
  attempt: number;
  at: number;
  /** For `slow`: whether its signal was aborted while it slept. */
  aborted?: boolean;
  abortedAt?: number;
}

const calls: Call[] = [];
let toolRuns = 0;

function record(ctx: OperatorContext): Call {
  const call: Call = { runId: ctx.runId, stepId: ctx.stepId, attempt: ctx.attempt, at: Date.now() };
  calls.push(call);
  return call;
}

function num(input: JsonValue, name: string, fallback: number): number {
  if (input === null || typeof input !== 'object' || Array.isArray(input)) return fallback;
  const v = input[name];
  return typeof v === 'number' ? v : fallback;
}

const callsOf = (runId: string) => calls.filter((c) => c.runId === runId);
const stepsCalled = (runId: string) => callsOf(runId).map((c) => `${c.stepId}#${c.attempt}`);

const lookup = defineTool({
  name: 'lookup',
  class: 'read_only',
  input: z.object({ i: z.number() }),
  run: (args) => {
    toolRuns++;
    return { i: args.i };
  },
});

let charges = 0;
/** A tool with an effect, which honours its idempotency key (an in-doubt call may run again). */
const charge = defineTool({
  name: 'charge',
  class: 'external',
  requiresIdempotencyKey: true,
  input: z.object({ cents: z.number() }),
  run: (args) => {
    charges++;
    return { charged: args.cents };
  },
});

const operators = {
  /** Charges `cents` through the `charge` tool. */
  paying: async (ctx: OperatorContext) => {
    record(ctx);
    return ctx.tools.call('charge', { cents: num(ctx.input, 'cents', 100) });
  },
  noop: (ctx: OperatorContext) => {
    record(ctx);
    return { step: ctx.stepId };
  },
  /** Fails (retryable) on its first `failTimes` attempts. */
  flaky: (ctx: OperatorContext) => {
    record(ctx);
    if (ctx.attempt <= num(ctx.input, 'failTimes', 2)) {
      throw Object.assign(new Error(`flaky attempt ${ctx.attempt}`), { retryable: true });
    }
    return { attempt: ctx.attempt };
  },
  /** Fails with a final error (invalid input) on every attempt up to `failTimes` (default: all). */
  fatal: (ctx: OperatorContext) => {
    record(ctx);
    if (ctx.attempt <= num(ctx.input, 'failTimes', Infinity)) {
      throw new InputValidationError('order', [{ path: 'qty', message: 'must be positive' }]);
    }
    return { fixed: ctx.attempt };
  },
  /** Sleeps `ms`, aborted by its signal (the abort is recorded). */
  slow: async (ctx: OperatorContext) => {
    const call = record(ctx);
    ctx.signal.addEventListener('abort', () => {
      call.aborted = ctx.signal.aborted;
      call.abortedAt = Date.now();
    });
    await sleep(num(ctx.input, 'ms', 3000), undefined, { signal: ctx.signal });
    return { slept: true };
  },
  /** Calls the `lookup` tool `n` times with different arguments. */
  tooly: async (ctx: OperatorContext) => {
    record(ctx);
    const out: JsonValue[] = [];
    for (let i = 0; i < num(ctx.input, 'n', 5); i++) {
      out.push(await ctx.tools.call<JsonValue>('lookup', { i }));
    }
    return { out };
  },
};

let redis: Redis;
let prefix: string;
let rt: Runtime;
let worker: FlujoWorker;

beforeAll(async () => {
  redis = connect();
  prefix = testPrefix();
  rt = createRuntime({
    redis: redisUrl(),
    prefix,
    queueName: 'drv',
    operators,
    tools: [lookup, charge],
  });
  worker = rt.createWorker({ concurrency: 8, recoveryMs: 1000 });
  await worker.ready();
});
afterAll(async () => {
  await worker.close();
  await rt.close();
  await deletePrefix(redis, prefix);
  await redis.quit();
});

type StepDef = { id: string; operator?: string; input?: JsonValue; [k: string]: unknown };

/** A line of steps, each depending on the one before. */
function line(name: string, steps: StepDef[], extra: Partial<PlanInput> = {}): PlanInput {
  return {
    name,
    defaults: { retry: { initialDelayMs: 20, jitter: 0 } },
    ...extra,
    steps: steps.map(({ id, operator, ...rest }, i) => ({
      id,
      ...(operator === undefined
        ? { kind: 'human_gate' as const }
        : { kind: 'operator' as const, operator }),
      ...(i === 0 ? {} : { dependsOn: [steps[i - 1]!.id] }),
      ...rest,
    })),
  };
}

async function events(runId: string): Promise<StoredRunEvent[]> {
  const out: StoredRunEvent[] = [];
  for await (const e of rt.events(runId)) out.push(e);
  return out;
}

async function outcomes(iter: AsyncIterable<StepOutcome>): Promise<StepOutcome[]> {
  const out: StepOutcome[] = [];
  for await (const o of iter) out.push(o);
  return out;
}

const brief = (o: StepOutcome) =>
  `${o.type}:${'stepId' in o && o.stepId !== undefined ? o.stepId : ''}${o.type === 'failure' ? (o.final ? ':final' : ':retry') : ''}`;

const ofType = (evs: StoredRunEvent[], type: string) => evs.filter((e) => e.type === type);

async function waitFor<T>(what: string, probe: () => T | undefined, timeoutMs = 5000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

describe('failures and retries', () => {
  it('a step failing twice with a retryable error runs 3 attempts, each recorded, with the backoff honoured', async () => {
    const run = await rt.start(
      line('retry', [
        { id: 'a', operator: 'noop' },
        {
          id: 'b',
          operator: 'flaky',
          input: { failTimes: 2 },
          retry: { maxAttempts: 3, initialDelayMs: 150, backoffCoefficient: 2, jitter: 0 },
        },
      ]),
    );
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced).toEqual({ a: { step: 'a' }, b: { attempt: 3 } });
    expect(done.summary.attempts).toBe(4);
    expect(stepsCalled(run.runId)).toEqual(['a#1', 'b#1', 'b#2', 'b#3']);

    const evs = await events(run.runId);
    const failed = ofType(evs, 'step.failed').map((e) => e.data);
    expect(failed.map((d) => [d['stepId'], d['attempt']])).toEqual([
      ['b', 1],
      ['b', 2],
    ]);
    expect(failed.every((d) => (d['error'] as { retryable: boolean }).retryable)).toBe(true);
    const toRetryable = ofType(evs, 'step.changed')
      .map((e) => e.data)
      .filter((d) => d['to'] === 'FAILED_RETRYABLE');
    expect(toRetryable.map((d) => [d['stepId'], d['from'], d['attempt']])).toEqual([
      ['b', 'RUNNING', 1],
      ['b', 'RUNNING', 2],
    ]);
    const due = ofType(evs, 'retry.due').map((e) => e.data);
    expect(due.map((d) => d['attempt'])).toEqual([2, 3]);
    expect(ofType(evs, 'step.succeeded').map((e) => [e.data['stepId'], e.data['attempt']])).toEqual(
      [
        ['a', 1],
        ['b', 3],
      ],
    );

    // Backoff: 150 ms after the first failure, 300 ms after the second (jitter 0).
    const bCalls = callsOf(run.runId).filter((c) => c.stepId === 'b');
    const failedAt = failed.map((d) => Number(d['at']));
    expect(Number(due[0]!['at']) - failedAt[0]!).toBeGreaterThanOrEqual(150);
    expect(Number(due[1]!['at']) - failedAt[1]!).toBeGreaterThanOrEqual(300);
    expect(bCalls[1]!.at - failedAt[0]!).toBeGreaterThanOrEqual(150);
    expect(bCalls[2]!.at - failedAt[1]!).toBeGreaterThanOrEqual(300);
    // … through delayed jobs.
    for (const [attempt, delay] of [
      [2, 150],
      [3, 300],
    ] as const) {
      const job = await runtimeCore(rt).queues.queue.getJob(retryJobId(run.runId, 'b', attempt));
      expect(job?.returnvalue).toBe('retry-due');
      expect(job?.opts.delay).toBeGreaterThan(delay - 50);
      expect(job?.opts.delay).toBeLessThanOrEqual(delay);
    }

    const outs = await outcomes(run.outcomes());
    expect(outs.map(brief)).toEqual([
      'success:a',
      'failure:b:retry',
      'failure:b:retry',
      'success:b',
    ]);
  });

  it('a step whose retries run out fails the run with retries_exhausted', async () => {
    const run = await rt.start(
      line('exhaust', [
        { id: 'x', operator: 'flaky', input: { failTimes: 9 }, retry: { maxAttempts: 2 } },
      ]),
    );
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.summary).toMatchObject({
      blockedStep: 'x',
      reason: 'retries_exhausted',
      attempts: 2,
    });
    expect(stepsCalled(run.runId)).toEqual(['x#1', 'x#2']);
  });

  it('a non-retryable error fails the run at once: blocked step, reason code, what was produced', async () => {
    const run = await rt.start(
      line('fatal', [
        { id: 'a', operator: 'noop' },
        { id: 'b', operator: 'fatal', retry: { maxAttempts: 5 } },
        { id: 'c', operator: 'noop' },
      ]),
    );
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.summary).toMatchObject({
      status: 'failed',
      blockedStep: 'b',
      reason: 'input_invalid',
      produced: { a: { step: 'a' } },
      attempts: 2,
    });
    expect(done.steps.map((s) => [s.stepId, s.status])).toEqual([
      ['a', 'SUCCEEDED'],
      ['b', 'FAILED_FINAL'],
      ['c', 'CANCELLED'],
    ]);
    expect(stepsCalled(run.runId)).toEqual(['a#1', 'b#1']);
    const evs = await events(run.runId);
    const finished = ofType(evs, 'run.finished');
    expect(finished).toHaveLength(1);
    expect(finished[0]!.data).toMatchObject({
      status: 'failed',
      blockedStep: 'b',
      reason: 'input_invalid',
      produced: { a: { step: 'a' } },
    });
    // Taken out of the active runs right after the final commit (settled() resolves on it).
    await vi.waitFor(async () =>
      expect(await redis.sismember(runtimeCore(rt).stores.keys.activeRuns(), run.runId)).toBe(0),
    );
  });
});

describe('chained units', () => {
  it('a carried step whose tool call another worker holds gets a job of its own, due when the lease lapses', async () => {
    const runId = `busy-${randomUUID()}`;
    const tenantId = runtimeCore(rt).tenantId;
    const args = { cents: 250 };
    // Another worker holds the lease on b's call for 600 ms more, and has gone quiet.
    const callId = ledgerCallId({ tenantId, runId, stepId: 'b', tool: charge.identity, args });
    await runtimeCore(rt).stores.ledger.begin(
      { runId, stepId: 'b', tenantId, callId, tool: charge.identity, args },
      600,
    );
    const run = await rt.start(
      line('busy', [
        { id: 'a', operator: 'noop' },
        { id: 'b', operator: 'paying', input: args },
      ]),
      null,
      { runId },
    );
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced['b']).toEqual({ charged: 250 });
    // a's job went on with b, met the lease, handed b to a job of its own and ended.
    expect((await runtimeCore(rt).queues.queue.getJob(stepJobId(runId, 'a', 1)))?.returnvalue).toBe(
      'busy',
    );
    // The job completes a moment after its commit (settled() resolves on the commit).
    const own = await vi.waitFor(async () => {
      const job = await runtimeCore(rt).queues.queue.getJob(stepJobId(runId, 'b', 1));
      expect(job?.returnvalue).toBe('succeeded');
      return job;
    });
    expect(own!.processedOn! - own!.timestamp).toBeGreaterThanOrEqual(200);
    // No attempt was spent: b ran twice as attempt 1, the tool once (after the lease lapsed).
    expect(stepsCalled(runId)).toEqual(['a#1', 'b#1', 'b#1']);
    expect(charges).toBe(1);
    expect(await runtimeCore(rt).stores.ledger.get(runId, tenantId, callId)).toMatchObject({
      state: 'SUCCEEDED',
      runs: 2,
    });
  });
});

describe('budgets', () => {
  async function expectBudgetStop(runId: string, budget: string) {
    const report = await rt.status(runId);
    expect(report.status).toBe('failed');
    expect(report.summary.reason).toBe('budget_exceeded');
    expect(report.summary.detail).toMatchObject({ budget });
    const finished = ofType(await events(runId), 'run.finished');
    expect(finished).toHaveLength(1);
    expect(finished[0]!.data).toMatchObject({
      status: 'failed',
      reason: 'budget_exceeded',
      detail: { budget },
    });
    return report;
  }

  it('maxSteps: a 5-step line with maxSteps 3 stops before the 4th step', async () => {
    const ids = ['s1', 's2', 's3', 's4', 's5'];
    const run = await rt.start(
      line(
        'max-steps',
        ids.map((id) => ({ id, operator: 'noop' })),
        { budgets: { maxSteps: 3 } },
      ),
    );
    await run.settled({ timeoutMs: 10_000 });
    const report = await expectBudgetStop(run.runId, 'maxSteps');
    expect(report.summary.detail).toEqual({ budget: 'maxSteps', limit: 3, used: 4 });
    expect(report.summary.produced).toEqual({
      s1: { step: 's1' },
      s2: { step: 's2' },
      s3: { step: 's3' },
    });
    expect(stepsCalled(run.runId)).toEqual(['s1#1', 's2#1', 's3#1']);
    expect(report.steps.map((s) => s.status)).toEqual([
      'SUCCEEDED',
      'SUCCEEDED',
      'SUCCEEDED',
      'CANCELLED',
      'CANCELLED',
    ]);
  });

  it('maxToolCalls: the third of five tool calls stops the run; the tool ran twice', async () => {
    const before = toolRuns;
    const run = await rt.start(
      line('max-tools', [{ id: 't', operator: 'tooly', input: { n: 5 } }], {
        budgets: { maxToolCalls: 2 },
      }),
    );
    await run.settled({ timeoutMs: 10_000 });
    const report = await expectBudgetStop(run.runId, 'maxToolCalls');
    expect(report.summary.detail).toEqual({ budget: 'maxToolCalls', limit: 2, used: 3 });
    expect(toolRuns - before).toBe(2);
    expect(stepsCalled(run.runId)).toEqual(['t#1']);
    const ledger = await rt.ledger(run.runId);
    expect(ledger.filter((e) => e.state === 'SUCCEEDED').map((e) => e.receipt)).toEqual(
      expect.arrayContaining([{ i: 0 }, { i: 1 }]),
    );
    expect(ledger.filter((e) => e.state === 'SUCCEEDED')).toHaveLength(2);
    expect(ledger.filter((e) => e.runs > 0)).toHaveLength(2);
  });

  it('maxWallClockMs: the deadline job stops a run whose step is still running', async () => {
    const t0 = Date.now();
    const run = await rt.start(
      line('max-wall', [{ id: 'slow', operator: 'slow', input: { ms: 2000 } }], {
        budgets: { maxWallClockMs: 300 },
      }),
    );
    const done = await run.settled({ timeoutMs: 10_000 });
    const stoppedAfter = Date.now() - t0;
    expect(done.status).toBe('failed');
    expect(stoppedAfter).toBeGreaterThanOrEqual(300);
    expect(stoppedAfter).toBeLessThan(1500); // the step alone would take 2000 ms
    const report = await expectBudgetStop(run.runId, 'maxWallClockMs');
    expect(report.summary.detail).toMatchObject({ budget: 'maxWallClockMs', limit: 300 });
    expect((report.summary.detail as { used: number }).used).toBeGreaterThanOrEqual(300);
    expect(report.steps.map((s) => [s.stepId, s.status])).toEqual([['slow', 'CANCELLED']]);
    // Let the attempt end before the next test (it is not committed either way).
    await waitFor('the slow attempt to end', () =>
      callsOf(run.runId)[0]!.aborted === true || Date.now() - t0 > 2100 ? true : undefined,
    );
    const evs = await events(run.runId);
    expect(ofType(evs, 'step.succeeded')).toHaveLength(0);
  });

  it('maxWallClockMs: the running attempt is aborted when the budget stops the run', async () => {
    const run = await rt.start(
      line('max-wall-abort', [{ id: 'slow', operator: 'slow', input: { ms: 2000 } }], {
        budgets: { maxWallClockMs: 300 },
      }),
    );
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.summary.reason).toBe('budget_exceeded');
    const call = await waitFor('the slow step to start', () => callsOf(run.runId)[0]);
    // The machine cancelled the running attempt and planned its abort (as for a cancel) …
    expect(done.steps[0]).toMatchObject({ status: 'CANCELLED', abortedAttempt: 1 });
    // … so the operator's signal must fire, well before its 2 s sleep ends.
    const deadline = Date.now() + 1000;
    while (call.aborted !== true && Date.now() < deadline) await sleep(10);
    expect(call.aborted).toBe(true);
  });
});

describe('gates', () => {
  const gated = () =>
    line('gated', [
      { id: 'a', operator: 'noop' },
      { id: 'g' }, // human_gate
      { id: 'c', operator: 'noop' },
    ]);

  it('approve: the run waits, then continues; who, when and the comment are in the events', async () => {
    const run = await rt.start(gated());
    const waiting = await run.settled({ timeoutMs: 10_000 });
    expect(waiting.status).toBe('waiting');
    expect(waiting.steps.map((s) => s.status)).toEqual([
      'SUCCEEDED',
      'WAITING_APPROVAL',
      'PENDING',
    ]);
    expect(stepsCalled(run.runId)).toEqual(['a#1']);
    const t = Date.now();
    await rt.approve(run.runId, 'g', { by: 'ana', comment: 'looks good' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced['g']).toEqual({ approvedBy: 'ana', comment: 'looks good' });
    expect(stepsCalled(run.runId)).toEqual(['a#1', 'c#1']);
    const approved = ofType(await events(run.runId), 'gate.approved');
    expect(approved).toHaveLength(1);
    expect(approved[0]!.data).toMatchObject({ stepId: 'g', by: 'ana', comment: 'looks good' });
    expect(Number(approved[0]!.data['at'])).toBeGreaterThanOrEqual(t);
    expect(Number(approved[0]!.data['at'])).toBeLessThanOrEqual(Date.now());
    const outs = (await outcomes(run.outcomes())).map(brief);
    expect(outs).toEqual(['success:a', 'paused:g', 'success:g', 'success:c']);
  });

  it('reject: the run fails with approval_rejected; the gated operator never runs', async () => {
    const run = await rt.start(
      line('gated-op', [
        { id: 'a', operator: 'noop' },
        { id: 'b', operator: 'noop', gate: { approvers: ['bo'] } },
        { id: 'c', operator: 'noop' },
      ]),
    );
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('waiting');
    await rt.reject(run.runId, 'b', { by: 'bo', comment: 'not today' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.summary).toMatchObject({
      blockedStep: 'b',
      reason: 'approval_rejected',
      produced: { a: { step: 'a' } },
    });
    expect(stepsCalled(run.runId)).toEqual(['a#1']);
    const evs = await events(run.runId);
    const rejected = ofType(evs, 'gate.rejected');
    expect(rejected).toHaveLength(1);
    expect(rejected[0]!.data).toMatchObject({ stepId: 'b', by: 'bo', comment: 'not today' });
    expect(typeof rejected[0]!.data['at']).toBe('number');
    expect(ofType(evs, 'run.finished')[0]!.data).toMatchObject({ reason: 'approval_rejected' });
  });

  it('approving a step that is not waiting throws StepNotWaitingError and writes nothing', async () => {
    const run = await rt.start(gated());
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('waiting');
    const before = await run.status();
    const eventCount = (await events(run.runId)).length;
    for (const [stepId, status] of [
      ['a', 'SUCCEEDED'],
      ['c', 'PENDING'],
      ['nope', null],
    ] as const) {
      const e = await rt.approve(run.runId, stepId, { by: 'ana' }).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(StepNotWaitingError);
      expect((e as StepNotWaitingError).status).toBe(status);
      const r = await rt.reject(run.runId, stepId, { by: 'ana' }).catch((x: unknown) => x);
      expect(r).toBeInstanceOf(StepNotWaitingError);
    }
    expect(await rt.approve(run.runId, 'g', { by: '' }).catch((x: unknown) => x)).toBeInstanceOf(
      InputValidationError,
    );
    const after = await run.status();
    expect(after.version).toBe(before.version);
    expect(after.updatedAt).toBe(before.updatedAt);
    expect((await events(run.runId)).length).toBe(eventCount);

    // Once approved, a second approval is refused the same way.
    await rt.approve(run.runId, 'g', { by: 'ana' });
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const v = (await run.status()).version;
    const again = await rt.approve(run.runId, 'g', { by: 'ana' }).catch((x: unknown) => x);
    expect(again).toBeInstanceOf(StepNotWaitingError);
    expect((await run.status()).version).toBe(v);
  });
});

describe('request keys', () => {
  const key = () => `req-${randomUUID()}`;

  it('complete: the same key gives the same run and its stored outcomes; nothing runs again', async () => {
    const k = key();
    const plan = line('rk-done', [
      { id: 'a', operator: 'noop' },
      { id: 'b', operator: 'noop' },
    ]);
    const first = await rt.start(plan, { n: 1 }, { requestKey: k });
    expect(first.created).toBe(true);
    expect((await first.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const stored = await outcomes(first.outcomes());

    const second = await rt.start(plan, { n: 2 }, { requestKey: k });
    expect(second).toMatchObject({ runId: first.runId, created: false });
    expect((await second.status()).status).toBe('succeeded');
    expect(await outcomes(second.outcomes())).toEqual(stored);
    expect(stored.map(brief)).toEqual(['success:a', 'success:b']);
    await sleep(100);
    expect(stepsCalled(first.runId)).toEqual(['a#1', 'b#1']);
  });

  it('running: the same key attaches, and following its outcomes receives the later results', async () => {
    const k = key();
    const plan = line('rk-running', [
      { id: 'a', operator: 'noop' },
      { id: 'b', operator: 'slow', input: { ms: 500 } },
      { id: 'c', operator: 'noop' },
    ]);
    const first = await rt.start(plan, null, { requestKey: k });
    await waitFor('b to run', () => callsOf(first.runId).find((c) => c.stepId === 'b'));
    const attachedAt = Date.now();
    const second = await rt.start(plan, null, { requestKey: k });
    expect(second).toMatchObject({ runId: first.runId, created: false });
    expect((await second.status()).status).toBe('running');
    const followed = await outcomes(second.outcomes({ follow: true }));
    expect(followed.map(brief)).toEqual(['success:a', 'success:b', 'success:c']);
    const c = followed[2]!;
    expect(c.at).toBeGreaterThan(attachedAt);
    expect((await second.status()).status).toBe('succeeded');
    expect(stepsCalled(first.runId)).toEqual(['a#1', 'b#1', 'c#1']);
  });

  it('concurrent starts with one key give one run, created once', async () => {
    const k = key();
    const plan = line('rk-race', [{ id: 'a', operator: 'noop' }]);
    const settledStarts = await Promise.allSettled(
      Array.from({ length: 5 }, () => rt.start(plan, null, { requestKey: k })),
    );
    const errors = settledStarts.flatMap((r) =>
      r.status === 'rejected' ? [String(r.reason)] : [],
    );
    expect(errors).toEqual([]);
    const handles = settledStarts.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
    expect(new Set(handles.map((h) => h.runId)).size).toBe(1);
    expect(handles.filter((h) => h.created)).toHaveLength(1);
    expect((await handles[0]!.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    expect(stepsCalled(handles[0]!.runId)).toEqual(['a#1']);
  });

  it('failed: partial outcomes, and resumeFailed resumes the run to success', async () => {
    const k = key();
    const plan = line('rk-failed', [
      { id: 'a', operator: 'noop' },
      { id: 'b', operator: 'fatal', input: { failTimes: 1 } },
      { id: 'c', operator: 'noop' },
    ]);
    const first = await rt.start(plan, null, { requestKey: k });
    expect((await first.settled({ timeoutMs: 10_000 })).status).toBe('failed');

    const again = await rt.start(plan, null, { requestKey: k });
    expect(again).toMatchObject({ runId: first.runId, created: false });
    const report = await again.status();
    expect(report.status).toBe('failed');
    expect(report.summary).toMatchObject({ blockedStep: 'b', produced: { a: { step: 'a' } } });
    expect((await outcomes(again.outcomes())).map(brief)).toEqual(['success:a', 'failure:b:final']);

    const resumed = await rt.start(plan, null, { requestKey: k, resumeFailed: true });
    expect(resumed).toMatchObject({ runId: first.runId, created: false });
    const done = await resumed.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced).toEqual({ a: { step: 'a' }, b: { fixed: 2 }, c: { step: 'c' } });
    expect(stepsCalled(first.runId)).toEqual(['a#1', 'b#1', 'b#2', 'c#1']);
    const evs = await events(first.runId);
    expect(ofType(evs, 'run.resumed')).toHaveLength(1);
    expect(ofType(evs, 'run.finished').map((e) => e.data['status'])).toEqual([
      'failed',
      'succeeded',
    ]);
  });
});

describe('cancel', () => {
  it('cancelling mid-run aborts the running attempt; the run ends cancelled; pending steps never run', async () => {
    const run = await rt.start(
      line('cancel', [
        { id: 's1', operator: 'slow', input: { ms: 5000 } },
        { id: 's2', operator: 'noop' },
        { id: 's3', operator: 'noop' },
      ]),
    );
    const call = await waitFor('s1 to run', () => callsOf(run.runId)[0]);
    const t = Date.now();
    await rt.cancel(run.runId, { by: 'ana', reason: 'changed my mind' });
    await waitFor('the abort', () => (call.aborted === true ? true : undefined), 2000);
    expect(call.abortedAt! - t).toBeLessThan(1000);
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('cancelled');
    expect(done.steps.map((s) => s.status)).toEqual(['CANCELLED', 'CANCELLED', 'CANCELLED']);
    await sleep(300);
    expect(stepsCalled(run.runId)).toEqual(['s1#1']);
    const evs = await events(run.runId);
    expect(ofType(evs, 'run.cancelled')[0]!.data).toMatchObject({
      by: 'ana',
      reason: 'changed my mind',
    });
    expect(ofType(evs, 'run.finished')).toHaveLength(1);
    expect(ofType(evs, 'run.finished')[0]!.data).toMatchObject({
      status: 'cancelled',
      reason: 'run_cancelled',
    });
    expect(ofType(evs, 'step.succeeded')).toHaveLength(0);
  });
});

describe('a restarted worker', () => {
  it('finds runs that have work but no job (the active-runs index) and finishes them', async () => {
    const p = testPrefix();
    const rt2 = createRuntime({ redis: redisUrl(), prefix: p, queueName: 'restart', operators });
    try {
      const handles = await Promise.all(
        Array.from({ length: 10 }, (_, i) =>
          rt2.start(
            line('restart', [
              { id: 'a', operator: 'noop' },
              { id: 'b', operator: 'noop' },
            ]),
            { i },
          ),
        ),
      );
      // The jobs are lost (as after a crash between create and enqueue): only the index is left.
      await runtimeCore(rt2).queues.queue.drain(true);
      expect(await runtimeCore(rt2).queues.queue.getJobCounts('wait', 'delayed', 'active')).toEqual(
        {
          wait: 0,
          delayed: 0,
          active: 0,
        },
      );
      expect(await redis.scard(runtimeCore(rt2).stores.keys.activeRuns())).toBe(10);

      // A worker without start-up recovery has nothing to do.
      const idle = rt2.createWorker({ recoverOnStart: false, recoveryMs: 400 });
      await idle.ready();
      await sleep(400);
      await idle.close();
      for (const h of handles) expect((await h.status()).status).toBe('running');
      expect(handles.flatMap((h) => callsOf(h.runId))).toEqual([]);

      const w = rt2.createWorker({ recoverOnStart: true, recoveryMs: 400 });
      try {
        await w.ready();
        for (const h of handles) {
          expect((await h.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
          expect(stepsCalled(h.runId)).toEqual(['a#1', 'b#1']);
        }
        await vi.waitFor(async () =>
          expect(await redis.scard(runtimeCore(rt2).stores.keys.activeRuns())).toBe(0),
        );
      } finally {
        await w.close();
      }
    } finally {
      await rt2.close();
      await deletePrefix(redis, p);
    }
  });
});
