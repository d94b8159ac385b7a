/**
 * Usage accounting, blobs and truncation of agent steps, on the scripted model server and a real
 * Redis: what is reserved and charged per model call, what the model is sent, and what the history
 * keeps.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineTool,
  type AgentDefinition,
  type AgentSpec,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
  type RuntimeOptions,
} from '../../src/index.js';
import type { Logger } from '../../src/logging.js';
import { JobName } from '../../src/actors/jobs.js';
import { deleteRuntimeKeys, redisUrl, scanKeys } from '../helpers/redis.js';
import { heldTool } from '../helpers/held-tool.js';
import { granularPlan, scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';
import { runtimeCore } from '../../src/runtime.js';

const model = useScriptedModel();
let runtime: Runtime;
let worker: FlujoWorker;
let prefix: string;
let warnings: string[];

const logger: Logger = {
  debug: () => {},
  info: () => {},
  warn: (_fields, message) => warnings.push(message),
  error: () => {},
};

const search = defineTool({
  name: 'search',
  input: z.object({ q: z.string(), bytes: z.number().optional() }),
  class: 'read_only',
  // Varied words, so the tokenizer cannot fold the text into a few long tokens.
  run: ({ q, bytes }) => ({ q, text: words(bytes ?? 10) }),
});
function words(bytes: number): string {
  let text = '';
  for (let i = 0; text.length < bytes; i++) text += `w${(i * 7919) % 1000} `;
  return text.slice(0, bytes);
}

const fetchPage = defineTool({
  name: 'fetch_page',
  input: z.object({ url: z.string() }),
  idempotent: true,
  run: ({ url }) => ({ url, body: `<p>${'y'.repeat(30_000)}</p>` }),
});

const agentWith = (over: Partial<AgentSpec> = {}): AgentDefinition =>
  scriptedAgent(model, {
    name: 'researcher',
    model: 'gpt-4o-mini',
    systemPrompt: 'Research, then answer.',
    tools: [search, fetchPage],
    settings: { maxTokens: 200 },
    ...over,
  });

const plan = (step: Record<string, unknown> = {}, budgets?: object): PlanInput =>
  granularPlan('usage', step, budgets === undefined ? {} : { budgets });

const pricing = { models: { 'gpt-4o-mini': { inputPerMillion: 0.15, outputPerMillion: 0.6 } } };

async function start(agent: AgentDefinition, options: Partial<RuntimeOptions> = {}): Promise<void> {
  runtime = createRuntime({ redis: redisUrl(), prefix, logger, pricing, ...options }).agent(agent);
  worker = runtime.createWorker({ concurrency: 2, recoveryMs: 1000 });
  await worker.ready();
}

beforeEach(() => {
  warnings = [];
  prefix = `t-${randomUUID().slice(0, 8)}`;
});
afterEach(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('usage of agent steps', () => {
  it('reserves before each call and reconciles once with the provider usage, priced', async () => {
    await start(agentWith());
    model.enqueue(
      {
        toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'a' } }],
        usage: { prompt_tokens: 120, completion_tokens: 15 },
      },
      { text: 'Done.', usage: { prompt_tokens: 180, completion_tokens: 5 } },
    );
    const run = await runtime.start(plan(), 'Go.');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const usage = await runtime.usage(run.runId);
    expect(usage.reservations.map((r) => [r.turn, r.state, r.outcome, r.charged?.tokens])).toEqual([
      [0, 'reconciled', 'usage', 135],
      [1, 'reconciled', 'usage', 185],
    ]);
    // The estimate reserved the maximum reply (settings.maxTokens) beside the counted input.
    expect(usage.reservations.every((r) => r.estimate.outputTokens === 200)).toBe(true);
    expect(usage.reservations[0]!.estimate.inputTokens).toBeGreaterThan(20);
    // 300 input tokens at 0.15 per million, 20 output at 0.6: 45 + 12 micro-USD, rounded up per call.
    expect(usage.reservations.map((r) => r.charged?.microUsd)).toEqual([
      Math.ceil(120 * 0.15 + 15 * 0.6),
      Math.ceil(180 * 0.15 + 5 * 0.6),
    ]);
    expect(usage.totals).toMatchObject({
      reservedTokens: 0,
      reservedMicroUsd: 0,
      spentTokens: 320,
      spentMicroUsd: 57,
    });
    // The journal knows which reservation each reply was charged to.
    const reply = await runtimeCore(runtime).stores.journal.get(run.runId, 'research', 0);
    expect(reply?.reservationId).toBe(usage.reservations[0]!.id);
  });

  it('charges the baseline input when the request was sent and no reply came (a timeout)', async () => {
    await start(agentWith({ timeoutMs: 300 }));
    model.enqueue(
      { fault: 'hang' },
      { text: 'Done.', usage: { prompt_tokens: 50, completion_tokens: 4 } },
    );
    const run = await runtime.start(plan(), 'Go.');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const [timedOut, answered] = (await runtime.usage(run.runId)).reservations;
    expect(timedOut).toMatchObject({ state: 'reconciled', outcome: 'baseline' });
    expect(timedOut!.sentAt).not.toBeNull();
    // No refund: exactly the input estimate, never the output buffer.
    expect(timedOut!.charged).toEqual({
      inputTokens: timedOut!.estimate.inputTokens,
      outputTokens: 0,
      tokens: timedOut!.estimate.inputTokens,
      microUsd: timedOut!.estimate.baselineMicroUsd,
    });
    expect(answered!.charged?.tokens).toBe(54);
  });

  it('an error answer (429) charges nothing; a call never sent charges nothing', async () => {
    await start(agentWith());
    model.enqueue({ fault: 'status', status: 429, retryAfter: 0 }, { text: 'Done.' });
    const run = await runtime.start(plan(), 'Go.');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const [rejected] = (await runtime.usage(run.runId)).reservations;
    expect(rejected).toMatchObject({ outcome: 'usage', charged: { tokens: 0, microUsd: 0 } });
  });

  it('the turn-skip path reserves and reconciles nothing', async () => {
    await start(agentWith());
    const { tool: slow, release } = heldTool('slow');
    await worker.close();
    await runtime.close();
    await start(agentWith({ tools: [search, slow] }));
    model.enqueue(
      { toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'x' } }] },
      { toolCalls: [{ id: 'c2', name: 'slow', arguments: {} }] },
      { text: 'Done.' },
    );
    const run = await runtime.start(plan(), 'Go.');
    // Both calls answered and reconciled (the model server counts a request before it answers).
    const reconciled = async () => {
      const { reservations } = await runtime.usage(run.runId);
      return reservations.length === 2 && reservations.every((r) => r.state === 'reconciled');
    };
    for (let i = 0; i < 200 && !(await reconciled()); i++)
      await new Promise((r) => setTimeout(r, 10));
    const before = (await runtime.usage(run.runId)).reservations;
    expect(before).toHaveLength(2);
    expect(before.map((r) => r.state)).toEqual(['reconciled', 'reconciled']);
    const job = await runtimeCore(runtime).queues.queue.add(
      JobName.turn,
      { runId: run.runId, stepId: 'research', attempt: 1, turn: 0 },
      { jobId: `redo-${randomUUID()}` },
    );
    for (let i = 0; i < 200 && !(await job.isCompleted()); i++)
      await new Promise((r) => setTimeout(r, 10));
    expect((await runtimeCore(runtime).queues.queue.getJob(job.id!))?.returnvalue).toBe(
      'turn-committed',
    );
    expect((await runtime.usage(run.runId)).reservations).toEqual(before);
    release();
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    expect((await runtime.usage(run.runId)).reservations).toHaveLength(3);
  });

  it('strict pricing refuses an unpriced model before any request', async () => {
    await start(agentWith({ model: 'gpt-unpriced' }), { strictPricing: true });
    model.enqueue({ text: 'never asked' });
    const run = await runtime.start(plan(), 'Go.');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.summary.reason).toBe('pricing_not_configured');
    expect(done.steps[0]!.error?.message).toContain('pricing.models["gpt-unpriced"]');
    expect(model.requestCount).toBe(0);
    expect((await runtime.usage(run.runId)).reservations).toEqual([]);
  });

  it('maxTokens and maxCostUsd budgets stop the run with budget_exceeded before the call', async () => {
    await start(agentWith());
    model.enqueue(
      {
        toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'a' } }],
        usage: { prompt_tokens: 300, completion_tokens: 10 },
      },
      { text: 'never sent' },
    );
    // Turn 0 reserves its estimate and spends 310; turn 1 would need 310 + its estimate.
    const run = await runtime.start(plan({}, { maxTokens: 500 }), 'Go.');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.summary.reason).toBe('budget_exceeded');
    expect(done.summary.detail).toMatchObject({ budget: 'maxTokens', limit: 500 });
    expect(model.requestCount).toBe(1);
    expect((await runtime.usage(run.runId)).totals).toMatchObject({
      spentTokens: 310,
      reservedTokens: 0,
    });

    model.reset();
    model.enqueue({ text: 'never sent' });
    const costly = await runtime.start(plan({}, { maxCostUsd: 0.00001 }), 'Go.');
    const stopped = await costly.settled({ timeoutMs: 10_000 });
    expect(stopped.summary.reason).toBe('budget_exceeded');
    expect(stopped.summary.detail).toMatchObject({ budget: 'maxCostUsd', limit: 0.00001 });
    expect(model.requestCount).toBe(0);
  });

  it("a tenant's quota refuses a call with UsageLimitExceededError and sends nothing", async () => {
    await start(agentWith());
    expect(await runtime.setTenantQuota('default', { maxTokens: 100 })).toEqual({
      maxTokens: 100,
      maxCostUsd: null,
    });
    model.enqueue({ text: 'never sent' });
    const run = await runtime.start(plan(), 'Go.');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.summary.reason).toBe('usage_limit_exceeded');
    expect(done.steps[0]!.error?.message).toMatch(
      /Tenant "default" .* would exceed its quota maxTokens/,
    );
    expect(model.requestCount).toBe(0);
  });
});

describe('token estimates', () => {
  it('counts known models with their tokenizer; an unknown one by characters, said once in the log', async () => {
    const infos: { fields: object; message: string }[] = [];
    await start(agentWith(), {
      logger: { ...logger, info: (fields, message) => infos.push({ fields, message }) },
    });
    expect(runtimeCore(runtime).registry.tokens('gpt-4o-mini')).toMatchObject({
      exact: true,
      encoding: 'o200k_base',
    });
    const guess = runtimeCore(runtime).registry.tokens('llama-3-8b');
    expect(guess).toMatchObject({ exact: false, encoding: null });
    expect(guess.countText('x'.repeat(41))).toBe(11);
    expect(runtimeCore(runtime).registry.tokens('llama-3-8b')).toBe(guess);
    expect(infos).toEqual([
      {
        fields: { model: 'llama-3-8b' },
        message:
          'no bundled tokenizer for model "llama-3-8b": tokens are estimated as ceil(characters / 4)',
      },
    ]);
  });
});

describe('blobs and truncation', () => {
  it('a tool result over the threshold is stored once as a blob and put back for the model', async () => {
    await start(agentWith());
    model.enqueue(
      { toolCalls: [{ id: 'c1', name: 'search', arguments: { q: 'big', bytes: 50_000 } }] },
      { text: 'Done.' },
    );
    const run = await runtime.start(plan(), 'Go.');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const history = await runtimeCore(runtime).stores.history.read(run.runId, 'research');
    const stored = history[2]!.content!;
    expect(stored).toMatch(/^<<FL_BLOB_REF:[0-9a-f]{64}:size=50\d{3}>>$/);
    // The model saw the whole result.
    const sent = model.requests[1]!.messages.find((m) => m.role === 'tool');
    expect(sent?.content).toBe(JSON.stringify({ q: 'big', text: words(50_000) }));
    expect(
      await runtimeCore(runtime).redis.hget(
        runtimeCore(runtime).stores.keys.blobs(run.runId),
        'count',
      ),
    ).toBe('1');
    // The ledger records the reference, not a second copy of the 50 KB.
    const [entry, ...others] = await runtime.ledger(run.runId);
    expect(others).toEqual([]);
    expect(entry?.receipt).toEqual({ $flujoBlob: stored });
    const ledgerKey = runtimeCore(runtime).stores.keys.ledger(run.runId, 'default');
    const ledgerBytes = Number(await runtimeCore(runtime).redis.call('MEMORY', 'USAGE', ledgerKey));
    expect(ledgerBytes).toBeGreaterThan(0);
    expect(ledgerBytes).toBeLessThan(5_000);
  });

  it('a missing blob fails fast, naming the blob and the step; degraded replay uses a marker', async () => {
    for (const degraded of [false, true]) {
      if (degraded) {
        await worker.close();
        await runtime.close();
        model.reset();
        warnings = [];
      }
      const { tool: wait, release } = heldTool('wait');
      // No blob cache: the next turn reads the blob back from Redis, as a fresh worker would.
      await start(agentWith({ tools: [fetchPage, wait] }), { blobs: { cacheBytes: 0 } });
      model.enqueue(
        { toolCalls: [{ id: 'c1', name: 'fetch_page', arguments: { url: 'https://a.example' } }] },
        { toolCalls: [{ id: 'c2', name: 'wait', arguments: {} }] },
        { text: 'Done.' },
      );
      const run = await runtime.start(plan({ degradedReplay: degraded }), 'Go.');
      for (let i = 0; i < 200 && model.requestCount < 2; i++)
        await new Promise((r) => setTimeout(r, 10));
      // The retention elapsed: the blob is gone before the next turn reads it back.
      const blobKeys = await scanKeys(
        runtimeCore(runtime).redis,
        `${prefix}:{${run.runId}}:blob:*`,
      );
      expect(blobKeys).toHaveLength(1);
      await runtimeCore(runtime).redis.del(...blobKeys);
      release();
      const done = await run.settled({ timeoutMs: 10_000 });
      if (!degraded) {
        expect(done.status).toBe('failed');
        expect(done.summary.reason).toBe('blob_missing');
        expect(done.steps[0]!.error?.message).toMatch(
          /Blob [0-9a-f]{64} needed by step "research"/,
        );
        expect(model.requestCount).toBe(2);
      } else {
        expect(done.status).toBe('succeeded');
        const sent = model.requests[2]!.messages.find((m) => m.role === 'tool');
        expect(sent?.content).toMatch(
          /^\[blob [0-9a-f]{64} \(\d+ bytes\) is no longer available\]$/,
        );
        expect(warnings).toContain(
          'a blob of the history is missing: replaying with a marker in its place (degraded replay)',
        );
      }
    }
  });

  it('truncates middle-out what the model is sent: exact head, placeholder and tail; the history keeps all', async () => {
    await start(agentWith({ systemPrompt: '' }));
    const turns = 6;
    for (let t = 0; t < turns; t++) {
      model.enqueue({
        toolCalls: [{ id: `c${t}`, name: 'search', arguments: { q: `q${t}`, bytes: 400 } }],
      });
    }
    model.enqueue({ text: 'Done.' });
    const run = await runtime.start(plan({ historyMaxTokens: 500 }), 'The first question.');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const history = await runtimeCore(runtime).stores.history.read(run.runId, 'research');
    expect(history).toHaveLength(1 + 2 * turns + 1);
    const last = model.requests.at(-1)!.messages;
    expect(last[0]).toEqual({ role: 'user', content: 'The first question.' });
    const placeholder = last[1]!;
    expect(placeholder.role).toBe('system');
    const omitted = Number(
      /^\.\.\. \[Context Truncated: (\d+) messages omitted\] \.\.\.$/.exec(
        String(placeholder.content),
      )![1],
    );
    // Head (1) + omitted + tail = everything before the last request.
    const tail = last.slice(2);
    expect(1 + omitted + tail.length).toBe(1 + 2 * turns);
    expect(omitted).toBeGreaterThan(0);
    expect(tail.length % 2).toBe(0);
    // The tail is the newest messages, each tool call with its result, exactly as stored.
    expect(tail[0]!.role).toBe('assistant');
    const shape = (m: object): string => {
      const { role, content, tool_calls } = m as {
        role: string;
        content: unknown;
        tool_calls?: { id: string }[];
      };
      return `${role}:${tool_calls?.map((c) => c.id).join(',') ?? String(content)}`;
    };
    expect(tail.map(shape)).toEqual(
      history.slice(history.length - 1 - tail.length, history.length - 1).map(shape),
    );
  });
});
