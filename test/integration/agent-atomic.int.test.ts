import { randomUUID } from 'node:crypto';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';

describe('atomic agent steps', () => {
  let model: ScriptedModelServer;
  let runtime: Runtime;
  let worker: FlujoWorker;
  let prefix: string;
  let notes: string[];

  beforeAll(async () => {
    model = await startScriptedModelServer();
  });
  afterAll(async () => {
    await model.close();
  });
  beforeEach(async () => {
    model.reset();
    notes = [];
    prefix = `t-${randomUUID().slice(0, 8)}`;
    const saveNote = defineTool({
      name: 'save_note',
      input: z.object({ text: z.string() }),
      requiresIdempotencyKey: true,
      run: ({ text }, ctx) => {
        notes.push(text);
        return { saved: text, key: ctx.idempotencyKey.slice(0, 8) };
      },
    });
    const researcher = defineAgent({
      name: 'researcher',
      model: 'gpt-test',
      provider: { baseURL: model.url, apiKey: 'test-key' },
      systemPrompt: 'Research, save notes, answer.',
      tools: [saveNote],
      timeoutMs: 2000,
    });
    runtime = createRuntime({ redis: redisUrl(), prefix }).agent(researcher);
    worker = runtime.createWorker({ concurrency: 2, recoveryMs: 1000 });
    await worker.ready();
  });
  afterEach(async () => {
    await worker.close();
    await runtime.close();
    await deleteRuntimeKeys(prefix);
  });

  const plan = (maxTurns = 5): PlanInput => ({
    name: 'research',
    steps: [
      {
        id: 'research',
        kind: 'agent',
        agent: 'researcher',
        maxTurns,
        retry: { maxAttempts: 3, initialDelayMs: 50, jitter: 0 },
      },
    ],
  });

  it('runs the loop to a final answer, tool calls through the ledger', async () => {
    model.enqueue(
      { toolCalls: [{ name: 'save_note', arguments: { text: 'durable' } }] },
      { text: 'Done: one note saved.' },
    );
    const run = await runtime.start(plan(), 'Find out about durable agents.');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced['research']).toMatchObject({
      answer: 'Done: one note saved.',
      turns: 2,
      toolCalls: 1,
    });
    expect(notes).toEqual(['durable']);
    expect(model.requestCount).toBe(2);
    // The second request carried the tool's result back to the model.
    const second = model.requests[1]!.messages as { role: string; content: string | null }[];
    expect(second.map((m) => m.role)).toEqual(['system', 'user', 'assistant', 'tool']);
    expect(second[3]!.content).toContain('"saved":"durable"');
    expect(await runtime.ledger(run.runId)).toHaveLength(1);
  });

  it('a restarted atomic step gets the recorded receipt instead of repeating the effect', async () => {
    model.enqueue(
      { toolCalls: [{ name: 'save_note', arguments: { text: 'once' } }] },
      { fault: 'status', status: 500, message: 'upstream exploded' },
      // Attempt 2 starts the loop again; the model asks for the identical call.
      { toolCalls: [{ name: 'save_note', arguments: { text: 'once' } }] },
      { text: 'Done.' },
    );
    const run = await runtime.start(plan(), 'Save one note.');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    expect(done.steps[0]!.attempt).toBe(2);
    expect(notes).toEqual(['once']);
    expect(model.requestCount).toBe(4);
    const ledger = await runtime.ledger(run.runId);
    expect(ledger).toHaveLength(1);
    expect(ledger[0]).toMatchObject({ state: 'SUCCEEDED', runs: 1 });
  });

  it('a 429 is retried no sooner than its retry-after', async () => {
    model.enqueue({ fault: 'status', status: 429, retryAfter: 1 }, { text: 'ok' });
    const run = await runtime.start(plan(), 'hi');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('succeeded');
    const events = [];
    for await (const e of runtime.events(run.runId)) events.push(e);
    const failed = events.find((e) => e.type === 'step.failed')!;
    const due = events.find((e) => e.type === 'retry.due')!;
    expect(failed.data['error']).toMatchObject({ code: 'model_error', retryAfterMs: 1000 });
    expect(Number(due.data['at']) - Number(failed.data['at'])).toBeGreaterThanOrEqual(1000);
  });

  it('a 401 fails the step finally with the fix in the message, and no key in it', async () => {
    model.enqueue({
      fault: 'status',
      status: 401,
      message: 'Incorrect API key provided: test-key',
    });
    const run = await runtime.start(plan(), 'hi');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.summary.reason).toBe('model_error');
    const detail = JSON.stringify(done.summary.detail);
    expect(detail).toContain('OPENAI_API_KEY');
    expect(detail).not.toContain('test-key');
    expect(model.requestCount).toBe(1);
  });

  it('maxTurns without a final answer fails the run with max_turns_exceeded', async () => {
    model.enqueue(
      { toolCalls: [{ name: 'save_note', arguments: { text: '1' } }] },
      { toolCalls: [{ name: 'save_note', arguments: { text: '2' } }] },
    );
    const run = await runtime.start(plan(2), 'loop');
    const done = await run.settled({ timeoutMs: 10_000 });
    expect(done.status).toBe('failed');
    expect(done.summary.reason).toBe('max_turns_exceeded');
    expect(notes).toEqual(['1', '2']);
  });
});
