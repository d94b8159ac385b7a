/**
 * A step's own `budgets` (`maxToolCalls`, `maxTokens`, `maxCostUsd`, `maxWallClockMs`) bound that
 * step alone: what would pass one is refused before it happens, the step fails finally with
 * `budget_exceeded` (no retry), its dependents are cancelled, independent steps go on, and the
 * run's summary names the step and the budget. A resume gives a step it reopens a fresh step budget.
 * Real Redis, a real worker, the scripted model server.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  type AgentDefinition,
  type FlujoWorker,
  type Runtime,
  type RuntimeOptions,
} from '../../src/index.js';
import { createKeys } from '../../src/persistence/keys.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { connect, deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';

let runtime: Runtime;
let worker: FlujoWorker;
let prefix: string;
let model: ScriptedModelServer;
let effects: string[];

const RETRY = { maxAttempts: 3, initialDelayMs: 20, maxDelayMs: 50, jitter: 0 };

const charge = defineTool({
  name: 'charge',
  input: z.object({ item: z.string() }),
  idempotent: false,
  run: ({ item }) => {
    effects.push(item);
    return { charged: item };
  },
});

const lookup = defineTool({
  name: 'lookup',
  input: z.object({ q: z.string() }),
  class: 'read_only',
  run: ({ q }) => ({ q, found: true }),
});

async function start(options: Partial<RuntimeOptions> = {}): Promise<void> {
  runtime = createRuntime({ redis: redisUrl(), prefix, tools: [charge, lookup], ...options });
  worker = runtime.createWorker({ concurrency: 4 });
  await worker.ready();
}

const agent = (): AgentDefinition =>
  defineAgent({
    name: 'researcher',
    model: 'gpt-4o-mini',
    provider: { baseURL: model.url, apiKey: 'test-key' },
    systemPrompt: 'Look things up, then answer.',
    tools: [lookup],
    settings: { maxTokens: 200 },
    timeoutMs: 5000,
  });

beforeAll(async () => {
  model = await startScriptedModelServer();
});
afterAll(async () => {
  await model.close();
});
beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  effects = [];
  model.reset();
});
afterEach(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('step budgets', () => {
  it('maxToolCalls: the call past the step budget never runs; the step fails finally, its dependent is cancelled, an independent step goes on', async () => {
    let payInvocations = 0;
    await start({
      operators: {
        pay: async ({ tools }) => {
          payInvocations++;
          for (const item of ['a', 'b', 'c']) await tools.call('charge', { item });
          return 'paid';
        },
        ship: async ({ tools }) => {
          for (const item of ['x', 'y']) await tools.call('charge', { item });
          return 'shipped';
        },
        notify: () => 'notified',
      },
    });
    const run = await runtime.start({
      name: 'tool-budget',
      steps: [
        {
          id: 'pay',
          kind: 'operator',
          operator: 'pay',
          budgets: { maxToolCalls: 1 },
          retry: RETRY,
        },
        // Its own budget, counted apart from pay's.
        { id: 'ship', kind: 'operator', operator: 'ship', budgets: { maxToolCalls: 2 } },
        { id: 'notify', kind: 'operator', operator: 'notify', dependsOn: ['pay'] },
      ],
    });
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(effects.filter((e) => ['a', 'b', 'c'].includes(e))).toEqual(['a']);
    expect(effects.filter((e) => ['x', 'y'].includes(e)).sort()).toEqual(['x', 'y']);
    expect(payInvocations).toBe(1);
    expect(done.summary).toMatchObject({
      blockedStep: 'pay',
      reason: 'budget_exceeded',
      produced: { ship: 'shipped' },
      detail: {
        code: 'budget_exceeded',
        retryable: false,
        details: { budget: 'maxToolCalls', limit: 1, used: 2, stepId: 'pay' },
      },
    });
    const byId = Object.fromEntries(done.steps.map((s) => [s.stepId, s]));
    expect(byId['pay']).toMatchObject({ status: 'FAILED_FINAL', attempt: 1 });
    expect(byId['notify']).toMatchObject({ status: 'CANCELLED', reason: 'upstream_failed' });
    // The refused call was recorded as prepared, never run.
    const payCalls = (await runtime.ledger(run.runId)).filter((e) => e.stepId === 'pay');
    expect(payCalls.map((e) => e.state).sort()).toEqual(['PREPARED', 'SUCCEEDED']);
  });

  it('maxTokens: the model call that would pass the step budget is refused before it is sent', async () => {
    await start({ agents: [agent()] });
    model.enqueue(
      {
        toolCalls: [{ id: 'c1', name: 'lookup', arguments: { q: 'a' } }],
        usage: { prompt_tokens: 5000, completion_tokens: 10 },
      },
      { text: 'never asked' },
    );
    const run = await runtime.start(
      {
        name: 'token-budget',
        steps: [
          {
            id: 'research',
            kind: 'agent',
            agent: 'researcher',
            budgets: { maxTokens: 5000 },
            retry: RETRY,
          },
        ],
      },
      'Go.',
    );
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(model.requestCount).toBe(1);
    expect(done.summary).toMatchObject({
      blockedStep: 'research',
      reason: 'budget_exceeded',
      detail: { details: { budget: 'maxTokens', limit: 5000, stepId: 'research' } },
    });
    expect(done.steps[0]).toMatchObject({ status: 'FAILED_FINAL', attempt: 1 });
    const usage = await runtime.usage(run.runId);
    expect(usage.reservations).toHaveLength(1);
    expect(usage.totals).toMatchObject({ spentTokens: 5010, reservedTokens: 0 });
  });

  it('maxCostUsd: a granular step is stopped before the call that would pass its cost budget', async () => {
    await start({
      agents: [agent()],
      pricing: { models: { 'gpt-4o-mini': { inputPerMillion: 0.15, outputPerMillion: 0.6 } } },
    });
    model.enqueue(
      {
        toolCalls: [{ id: 'c1', name: 'lookup', arguments: { q: 'a' } }],
        // $0.15 of input: past the step's $0.10.
        usage: { prompt_tokens: 1_000_000, completion_tokens: 10 },
      },
      { text: 'never asked' },
    );
    const run = await runtime.start(
      {
        name: 'cost-budget',
        steps: [
          {
            id: 'research',
            kind: 'agent',
            agent: 'researcher',
            mode: 'granular',
            budgets: { maxCostUsd: 0.1 },
            retry: RETRY,
          },
        ],
      },
      'Go.',
    );
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(model.requestCount).toBe(1);
    expect(done.summary).toMatchObject({
      blockedStep: 'research',
      reason: 'budget_exceeded',
      detail: { details: { budget: 'maxCostUsd', limit: 0.1, stepId: 'research' } },
    });
    // The first turn was committed; the step failed before its second model call.
    expect(done.steps[0]).toMatchObject({ status: 'FAILED_FINAL', attempt: 1 });
    expect(done.steps[0]!.agent).toMatchObject({ turns: 1 });
  });

  it('maxWallClockMs: bounds the step across its attempts; the attempt running when it is spent fails finally', async () => {
    const invoked: number[] = [];
    await start({
      operators: {
        flaky: async (ctx) => {
          invoked.push(ctx.attempt);
          if (ctx.attempt === 1) throw Object.assign(new Error('flaky'), { retryable: true });
          // Would succeed after 10 s; honours its signal.
          await new Promise<void>((ok, fail) => {
            const t = setTimeout(ok, 10_000);
            ctx.signal.addEventListener('abort', () => {
              clearTimeout(t);
              fail(ctx.signal.reason as Error);
            });
          });
          return 'late';
        },
      },
    });
    const t0 = Date.now();
    const run = await runtime.start({
      name: 'wall-clock',
      steps: [
        {
          id: 'work',
          kind: 'operator',
          operator: 'flaky',
          // Longer than the budget: the step's wall clock ends the attempt first.
          timeoutMs: 60_000,
          budgets: { maxWallClockMs: 1000 },
          retry: RETRY,
        },
      ],
    });
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(Date.now() - t0).toBeLessThan(9000);
    expect(invoked).toEqual([1, 2]);
    expect(done.summary).toMatchObject({
      blockedStep: 'work',
      reason: 'budget_exceeded',
      detail: { details: { budget: 'maxWallClockMs', limit: 1000, stepId: 'work' } },
    });
    expect(done.steps[0]).toMatchObject({ status: 'FAILED_FINAL', attempt: 2 });
  });

  it('maxToolCalls: a resume gives the step a fresh step budget; its tool calls are counted from zero', async () => {
    let payInvocations = 0;
    await start({
      operators: {
        pay: async ({ tools }) => {
          payInvocations++;
          for (const item of ['a', 'b', 'c']) await tools.call('charge', { item });
          return 'paid';
        },
      },
    });
    const run = await runtime.start({
      name: 'tool-budget-resume',
      steps: [
        {
          id: 'pay',
          kind: 'operator',
          operator: 'pay',
          budgets: { maxToolCalls: 2 },
          retry: RETRY,
        },
      ],
    });
    const failed = await run.settled({ timeoutMs: 20_000 });
    expect(failed.status).toBe('failed');
    expect(failed.summary.detail).toMatchObject({
      details: { budget: 'maxToolCalls', limit: 2, used: 3, stepId: 'pay' },
    });
    expect(effects).toEqual(['a', 'b']);

    await runtime.resume(run.runId);
    const done = await run.settled({ timeoutMs: 20_000 });
    // The resumed attempt ran: a and b gave their receipts again for free, c was the step's
    // first counted call of its new budget (it would be its fourth without the reset).
    expect(done.status).toBe('succeeded');
    expect(done.steps[0]).toMatchObject({ status: 'SUCCEEDED', attempt: 2 });
    expect(payInvocations).toBe(2);
    expect(effects).toEqual(['a', 'b', 'c']);
    const redis = connect();
    try {
      const counters = await redis.hgetall(createKeys(prefix).counters(run.runId));
      // The step counted from zero; the run's own count goes on across the resume.
      expect(counters).toMatchObject({ 'step:pay:toolCalls': '1', toolCalls: '4' });
    } finally {
      redis.disconnect();
    }
  });

  it('maxWallClockMs: a resume gives the step a fresh wall clock', async () => {
    const invoked: number[] = [];
    await start({
      operators: {
        slow: async (ctx) => {
          invoked.push(ctx.attempt);
          // The first attempt outlives the step's wall clock; the resumed one takes 100 ms.
          const ms = ctx.attempt === 1 ? 10_000 : 100;
          await new Promise<void>((ok, fail) => {
            const t = setTimeout(ok, ms);
            ctx.signal.addEventListener('abort', () => {
              clearTimeout(t);
              fail(ctx.signal.reason as Error);
            });
          });
          return 'done';
        },
      },
    });
    const run = await runtime.start({
      name: 'wall-clock-resume',
      steps: [
        {
          id: 'work',
          kind: 'operator',
          operator: 'slow',
          budgets: { maxWallClockMs: 500 },
          retry: RETRY,
        },
      ],
    });
    const failed = await run.settled({ timeoutMs: 20_000 });
    expect(failed.status).toBe('failed');
    expect(failed.summary.detail).toMatchObject({
      details: { budget: 'maxWallClockMs', limit: 500, stepId: 'work' },
    });
    // Well past the step's wall clock, counted from its first attempt.
    await new Promise((ok) => setTimeout(ok, 600));
    await runtime.resume(run.runId);
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('succeeded');
    expect(done.steps[0]).toMatchObject({ status: 'SUCCEEDED', attempt: 2 });
    expect(invoked).toEqual([1, 2]);
  });
});
