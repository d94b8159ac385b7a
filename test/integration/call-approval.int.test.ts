/**
 * Tools with risk level high or critical: each call waits for a person's approval before its
 * effect, and an approval covers that one call, once. Checked in operator, granular and atomic
 * agent steps, against the effects at the tool, the model's requests and what Redis holds.
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  InputValidationError,
  type FlujoWorker,
  type OperatorContext,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { connect, deleteRuntimeKeys, redisUrl, scanKeys } from '../helpers/redis.js';

/** Effects at the payment service, by idempotency key: one line per effect. */
let effects: { key: string; cents: number }[];
/** Every time the tool's code ran (effect or not). */
let toolRuns: number;
/** Calls of the tool that throw a retryable error before any effect. */
let failNext: number;
let operatorRuns: string[];

const pay = defineTool({
  name: 'pay',
  // A granular step fills idempotency_key in (the turn's key); operators leave it out.
  input: z.object({ cents: z.number().int().positive(), idempotency_key: z.string().optional() }),
  class: 'external',
  requiresIdempotencyKey: true,
  riskLevel: 'critical',
  run: ({ cents }, ctx) => {
    toolRuns++;
    if (failNext > 0) {
      failNext--;
      throw Object.assign(new Error('the bank timed out'), { retryable: true });
    }
    if (!effects.some((e) => e.key === ctx.idempotencyKey)) {
      effects.push({ key: ctx.idempotencyKey, cents });
    }
    return { paid: cents };
  },
});

const operators = {
  /** Pays each amount of its input in turn. */
  payer: async (ctx: OperatorContext) => {
    operatorRuns.push(`${ctx.stepId}#${ctx.attempt}`);
    const out: unknown[] = [];
    for (const cents of (ctx.input as { amounts: number[] }).amounts) {
      out.push(await ctx.tools.call('pay', { cents }));
    }
    return { out } as never;
  },
};

let model: ScriptedModelServer;
let redis: Redis;
let runtime: Runtime;
let worker: FlujoWorker;
let prefix: string;

beforeAll(async () => {
  model = await startScriptedModelServer();
  redis = connect();
});
afterAll(async () => {
  await model.close();
  await redis.quit();
});
beforeEach(async () => {
  model.reset();
  effects = [];
  toolRuns = 0;
  failNext = 0;
  operatorRuns = [];
  prefix = `t-${randomUUID().slice(0, 8)}`;
  const cashier = defineAgent({
    name: 'cashier',
    model: 'gpt-test',
    provider: { baseURL: model.url, apiKey: 'test-key' },
    systemPrompt: 'Pay what is asked.',
    tools: [pay],
    timeoutMs: 2000,
  });
  runtime = createRuntime({ redis: redisUrl(), prefix, operators, tools: [pay] }).agent(cashier);
  worker = runtime.createWorker({ concurrency: 2, recoveryMs: 1000 });
  await worker.ready();
});
afterEach(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

const operatorPlan = (amounts: number[], retry = 1): PlanInput => ({
  name: 'pay-op',
  steps: [
    {
      id: 'pay',
      kind: 'operator',
      operator: 'payer',
      input: { amounts },
      retry: { maxAttempts: retry, initialDelayMs: 20, jitter: 0 },
    },
  ],
});

const agentPlan = (mode: 'atomic' | 'granular'): PlanInput => ({
  name: `pay-${mode}`,
  steps: [{ id: 'agent', kind: 'agent', agent: 'cashier', mode, maxTurns: 5 }],
});

async function typesOf(runId: string): Promise<string[]> {
  const out: string[] = [];
  for await (const e of runtime.events(runId)) out.push(e.type);
  return out;
}

/** Every key of the run with its content. */
async function runKeys(runId: string): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  for (const key of await scanKeys(redis, `${prefix}:{${runId}}*`)) {
    const type = await redis.type(key);
    if (type === 'hash') out[key] = await redis.hgetall(key);
    else if (type === 'stream') out[key] = await redis.xrange(key, '-', '+');
    else if (type === 'list') out[key] = await redis.lrange(key, 0, -1);
    else out[key] = await redis.get(key);
  }
  return out;
}

describe('a risky tool in an operator step', () => {
  it('waits before its effect showing the call; the approval lets that call run once', async () => {
    const run = await runtime.start(operatorPlan([500]));
    const waiting = await run.settled({ timeoutMs: 10_000 });
    expect(waiting.status).toBe('waiting');
    expect(waiting.steps[0]).toMatchObject({ status: 'WAITING_APPROVAL', attempt: 1, pauses: 0 });
    const call = waiting.approvals[0]!.call!;
    expect(call).toMatchObject({ tool: 'pay@1', args: { cents: 500 }, toolCallId: null });
    expect(call.callId).toMatch(/^[0-9a-f]{64}$/);
    expect(effects).toEqual([]);
    expect(toolRuns).toBe(0);
    expect((await runtime.ledger(run.runId)).map((e) => [e.callId, e.state, e.runs])).toEqual([
      [call.callId, 'PREPARED', 0],
    ]);

    // A decision naming another call is refused and writes nothing.
    const before = await runKeys(run.runId);
    const wrong = await runtime
      .approve(run.runId, 'pay', { by: 'ana', callId: 'f'.repeat(64) })
      .catch((x: unknown) => x);
    expect(wrong).toBeInstanceOf(InputValidationError);
    expect((wrong as Error).message).toContain(call.callId);
    expect(await runKeys(run.runId)).toEqual(before);

    await runtime.approve(run.runId, 'pay', { by: 'ana', callId: call.callId });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced['pay']).toEqual({ out: [{ paid: 500 }] });
    expect(effects).toEqual([{ key: call.callId, cents: 500 }]);
    expect(toolRuns).toBe(1);
    // Paused once, resumed once: the same attempt, two executions.
    expect(operatorRuns).toEqual(['pay#1', 'pay#1']);
    expect(done.steps[0]).toMatchObject({
      attempt: 1,
      pauses: 1,
      callDecisions: [{ callId: call.callId, attempt: 1, approved: true, by: 'ana' }],
    });
    const types = await typesOf(run.runId);
    expect(types.filter((t) => t === 'tool.approvalRequested')).toHaveLength(1);
    expect(types.filter((t) => t === 'gate.approved')).toHaveLength(1);
  });

  it('each call needs its own approval', async () => {
    const run = await runtime.start(operatorPlan([100, 200]));
    for (const cents of [100, 200]) {
      const waiting = await run.settled({ timeoutMs: 10_000 });
      expect(waiting.approvals[0]!.call!.args).toEqual({ cents });
      expect(effects.map((e) => e.cents)).toEqual(cents === 100 ? [] : [100]);
      await runtime.approve(run.runId, 'pay', { by: 'ana' });
    }
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(effects.map((e) => e.cents)).toEqual([100, 200]);
    expect(toolRuns).toBe(2);
    expect(operatorRuns).toEqual(['pay#1', 'pay#1', 'pay#1']);
  });

  it('a retried call asks again: the approval covered one attempt', async () => {
    failNext = 1;
    const run = await runtime.start(operatorPlan([700], 2));
    await run.settled({ timeoutMs: 10_000 });
    await runtime.approve(run.runId, 'pay', { by: 'ana' });
    // Attempt 1's call failed (retryable, no effect); attempt 2 makes the same call and waits.
    const again = await run.settled({ timeoutMs: 10_000 });
    expect(again.status).toBe('waiting');
    expect(again.steps[0]).toMatchObject({ attempt: 2, status: 'WAITING_APPROVAL' });
    expect(toolRuns).toBe(1);
    expect(effects).toEqual([]);
    await runtime.approve(run.runId, 'pay', { by: 'bo' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(toolRuns).toBe(2);
    expect(effects.map((e) => e.cents)).toEqual([700]);
    expect(done.steps[0]!.callDecisions).toEqual([
      expect.objectContaining({ attempt: 2, approved: true, by: 'bo' }),
    ]);
  });

  it('rejected: the step fails finally with ToolCallRejectedError and nothing ran', async () => {
    const run = await runtime.start(operatorPlan([900], 3));
    await run.settled({ timeoutMs: 10_000 });
    await runtime.reject(run.runId, 'pay', { by: 'ana', comment: 'too much' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.summary.reason).toBe('tool_call_rejected');
    expect(done.steps[0]).toMatchObject({ status: 'FAILED_FINAL', attempt: 1 });
    expect(done.steps[0]!.error).toMatchObject({
      name: 'ToolCallRejectedError',
      code: 'tool_call_rejected',
      retryable: false,
    });
    expect(done.steps[0]!.error!.message).toContain('rejected by ana: too much');
    expect(effects).toEqual([]);
    expect(toolRuns).toBe(0);
  });
});

describe('a risky tool in an agent step', () => {
  it('granular: the turn waits; once approved it runs from its journaled reply, with no new model call', async () => {
    model.enqueue(
      { toolCalls: [{ name: 'pay', arguments: { cents: 300 } }] },
      { text: 'Paid 300.' },
    );
    const run = await runtime.start(agentPlan('granular'), 'Pay 300.');
    const waiting = await run.settled({ timeoutMs: 10_000 });
    expect(waiting.status).toBe('waiting');
    const call = waiting.approvals[0]!.call!;
    expect(call).toMatchObject({ tool: 'pay@1', args: { cents: 300 }, turn: 0 });
    expect(call.args).toHaveProperty('idempotency_key', expect.any(String));
    expect(call.toolCallId).toEqual(expect.any(String));
    expect(model.requestCount).toBe(1);
    expect(effects).toEqual([]);
    await runtime.approve(run.runId, 'agent', { by: 'ana' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced['agent']).toMatchObject({ answer: 'Paid 300.', turns: 2 });
    expect(model.requestCount).toBe(2);
    expect(effects.map((e) => e.cents)).toEqual([300]);
    expect(effects[0]!.key).toBe(call.callId);
  });

  it('granular: a rejected call is the tool error the model reads, and the agent goes on', async () => {
    model.enqueue(
      { toolCalls: [{ name: 'pay', arguments: { cents: 99_999 } }] },
      { text: 'I could not pay.' },
    );
    const run = await runtime.start(agentPlan('granular'), 'Pay a lot.');
    await run.settled({ timeoutMs: 10_000 });
    await runtime.reject(run.runId, 'agent', { by: 'ana', comment: 'over the limit' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(effects).toEqual([]);
    expect(toolRuns).toBe(0);
    expect(model.requestCount).toBe(2);
    const second = model.requests[1]!.messages as { role: string; content: string | null }[];
    expect(second.at(-1)).toMatchObject({
      role: 'tool',
      content: 'error: rejected by ana: over the limit',
    });
  });

  it('atomic: the paused loop replays its model replies, so the approved call is the one that runs', async () => {
    model.enqueue(
      { toolCalls: [{ name: 'pay', arguments: { cents: 40 } }] },
      // Were the model asked again, it would ask for another payment.
      { text: 'Paid 40.' },
      { toolCalls: [{ name: 'pay', arguments: { cents: 41 } }] },
    );
    const run = await runtime.start(agentPlan('atomic'), 'Pay 40.');
    const waiting = await run.settled({ timeoutMs: 10_000 });
    expect(waiting.approvals[0]!.call!.args).toEqual({ cents: 40 });
    expect(model.requestCount).toBe(1);
    await runtime.approve(run.runId, 'agent', { by: 'ana' });
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced['agent']).toMatchObject({ answer: 'Paid 40.', turns: 2 });
    expect(model.requestCount).toBe(2);
    expect(effects.map((e) => e.cents)).toEqual([40]);
  });
});
