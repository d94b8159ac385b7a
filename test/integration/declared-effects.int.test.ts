/**
 * Declared effects bound the tool classes a step may call: a call of a tool of another class (but
 * read-only) is refused before it is recorded or run, in operator steps and agent steps alike.
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { OperatorContext } from '../../src/execution/execute-step.js';
import { defineAgent } from '../../src/agents/define-agent.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { defineTool } from '../../src/tools/define-tool.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { connect, deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

/** Effects at the "service", by tool. */
const effects = { send: 0, lookup: 0, cache: 0 };

const send = defineTool({
  name: 'send',
  class: 'external',
  requiresIdempotencyKey: true,
  input: z.object({ to: z.string() }),
  run: ({ to }) => {
    effects.send++;
    return { sent: to };
  },
});
const lookup = defineTool({
  name: 'lookup',
  class: 'read_only',
  input: z.object({ q: z.string() }),
  run: ({ q }) => {
    effects.lookup++;
    return { found: q };
  },
});
const cache = defineTool({
  name: 'cache',
  class: 'local',
  idempotent: true,
  input: z.object({ k: z.string() }),
  run: ({ k }) => {
    effects.cache++;
    return { cached: k };
  },
});

/** Calls the tools its input lists, in order. */
const caller = async (ctx: OperatorContext) => {
  const out: unknown[] = [];
  for (const name of (ctx.input as { tools: string[] }).tools) {
    const args = name === 'send' ? { to: 'ana' } : name === 'lookup' ? { q: 'x' } : { k: 'y' };
    out.push(await ctx.tools.call(name, args));
  }
  return { out } as never;
};

let redis: Redis;
let runtime: Runtime;
let worker: FlujoWorker;
let model: ScriptedModelServer;
const prefix = testPrefix();

beforeAll(async () => {
  redis = connect();
  model = await startScriptedModelServer();
  const mailer = defineAgent({
    name: 'mailer',
    model: 'gpt-test',
    provider: { baseURL: model.url, apiKey: 'test-key' },
    systemPrompt: 'Send mail.',
    tools: [send, lookup],
    timeoutMs: 2000,
  });
  runtime = createRuntime({
    redis: redisUrl(),
    prefix,
    operators: { caller },
    tools: [send, lookup, cache],
    agents: [mailer],
    policies: {
      'mail-off': {
        check: () => ({ allow: false, reason: 'mail is off today' }),
        appliesTo: { tags: ['mail'] },
      },
    },
  });
  worker = runtime.createWorker({ concurrency: 2 });
  await worker.ready();
});
afterAll(async () => {
  await worker.close();
  await runtime.close();
  await model.close();
  await deleteRuntimeKeys(prefix);
  redis.disconnect();
});

const one = (tools: string[], declared?: string[]): PlanInput => ({
  name: 'effects',
  defaults: { retry: { maxAttempts: 3, initialDelayMs: 10, jitter: 0 } },
  steps: [
    {
      id: 'work',
      kind: 'operator',
      operator: 'caller',
      input: { tools },
      ...(declared === undefined ? {} : { effects: declared as never }),
    },
  ],
});

const reset = () => {
  effects.send = 0;
  effects.lookup = 0;
  effects.cache = 0;
};

describe('declared effects', { timeout: 30_000 }, () => {
  it('an operator step declaring local effects cannot call an external tool: refused before the effect, final, nothing in the ledger', async () => {
    reset();
    const run = await runtime.start(one(['lookup', 'cache', 'send'], ['local']));
    const report = await run.settled({ timeoutMs: 20_000 });
    expect(report.status).toBe('failed');
    const step = report.steps[0]!;
    expect(step.status).toBe('FAILED_FINAL');
    expect(step.attempt).toBe(1);
    expect(step.error?.code).toBe('configuration_invalid');
    expect(step.error?.message).toContain(
      'step "work" declares effects [local], but tool "send" has class "external"',
    );
    // Read-only and local ran; the external effect never happened, and was never recorded.
    expect(effects).toEqual({ send: 0, lookup: 1, cache: 1 });
    const ledger = await runtime.ledger(run.runId);
    expect(ledger.map((e) => e.tool.split('@')[0]).sort()).toEqual(['cache', 'lookup']);
  });

  it('a declared class is allowed, read-only always is, and undeclared effects stay unchecked', async () => {
    reset();
    const declared = await runtime.start(one(['lookup', 'send'], ['external']));
    expect((await declared.settled({ timeoutMs: 20_000 })).status).toBe('succeeded');
    expect(effects).toEqual({ send: 1, lookup: 1, cache: 0 });
    reset();
    const open = await runtime.start(one(['lookup', 'cache', 'send']));
    expect((await open.settled({ timeoutMs: 20_000 })).status).toBe('succeeded');
    expect(effects).toEqual({ send: 1, lookup: 1, cache: 1 });
  });

  it('an agent step declaring read_only effects: the model asking for an external tool fails the step, no mail sent', async () => {
    reset();
    model.reset();
    model.enqueue(
      { toolCalls: [{ name: 'lookup', arguments: { q: 'ana' } }] },
      { toolCalls: [{ name: 'send', arguments: { to: 'ana' } }] },
      { text: 'sent' },
    );
    const run = await runtime.start({
      name: 'agent-effects',
      steps: [
        {
          id: 'mail',
          kind: 'agent',
          agent: 'mailer',
          effects: ['read_only'],
          retry: { maxAttempts: 3, initialDelayMs: 10, jitter: 0 },
        },
      ],
    });
    const report = await run.settled({ timeoutMs: 20_000 });
    expect(report.status).toBe('failed');
    expect(report.steps[0]!.attempt).toBe(1);
    expect(report.steps[0]!.error?.message).toContain(
      'step "mail" declares effects [read_only], but tool "send" has class "external"',
    );
    expect(effects).toEqual({ send: 0, lookup: 1, cache: 0 });
    expect(model.requestCount).toBe(2);
  });

  it("a policy bound to an agent step's tag denies before the model is asked or any tool runs", async () => {
    reset();
    model.reset();
    model.enqueue({ toolCalls: [{ name: 'send', arguments: { to: 'ana' } }] }, { text: 'sent' });
    for (const mode of ['atomic', 'granular'] as const) {
      const run = await runtime.start({
        name: 'agent-policy',
        steps: [{ id: 'mail', kind: 'agent', agent: 'mailer', mode, policyTags: ['mail'] }],
      });
      const report = await run.settled({ timeoutMs: 20_000 });
      expect(report.status).toBe('failed');
      expect(report.summary.reason).toBe('policy_denied');
      expect(report.steps[0]!.attempt).toBe(1);
    }
    expect(model.requestCount).toBe(0);
    expect(effects).toEqual({ send: 0, lookup: 0, cache: 0 });
  });
});
