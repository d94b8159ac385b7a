/**
 * A step's `timeoutMs` bounds one attempt (one turn of a granular agent step): the attempt's signal
 * is aborted, the attempt fails retryable with code `timeout`, and the step's retry policy decides
 * what follows. Real Redis, a real worker, and the scripted model server for the agent step.
 */
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
  type RuntimeOptions,
} from '../../src/index.js';
import type { StoredRunEvent } from '../../src/persistence/snapshot-store.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { encoderFor, encodingForModel } from '../../src/llm/tokens.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';

let runtime: Runtime;
let worker: FlujoWorker;
let prefix: string;
let model: ScriptedModelServer;

const sleep = (ms: number) => new Promise((ok) => setTimeout(ok, ms));
const RETRY = { maxAttempts: 2, initialDelayMs: 20, maxDelayMs: 50, jitter: 0 };

async function start(options: Partial<RuntimeOptions> = {}, toolLeaseMs = 5000): Promise<void> {
  runtime = createRuntime({ redis: redisUrl(), prefix, ...options });
  worker = runtime.createWorker({ concurrency: 4, recoveryMs: 2000, toolLeaseMs });
  await worker.ready();
}

async function events(runId: string): Promise<StoredRunEvent[]> {
  const out: StoredRunEvent[] = [];
  for await (const e of runtime.events(runId)) out.push(e);
  return out;
}

const failures = (all: StoredRunEvent[]) =>
  all.filter((e) => e.type === 'step.failed').map((e) => e.data) as unknown as {
    attempt: number;
    error: { code: string; retryable: boolean };
  }[];

beforeAll(async () => {
  model = await startScriptedModelServer();
  // The tokenizer is built on first use (seconds on a loaded machine): not inside a timed turn.
  encoderFor(encodingForModel('gpt-4o-mini')!);
});
afterAll(async () => {
  await model.close();
});
beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  model.reset();
});
afterEach(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('step timeoutMs', () => {
  it('fails an attempt that outlives timeoutMs with code timeout, retries it, and never commits its late success', async () => {
    const invoked: { attempt: number; reason: unknown }[] = [];
    let lateReturned = false;
    await start({
      operators: {
        slow: async (ctx) => {
          const me = { attempt: ctx.attempt, reason: undefined as unknown };
          invoked.push(me);
          ctx.signal.addEventListener('abort', () => (me.reason = ctx.signal.reason as unknown));
          if (ctx.attempt === 1) {
            // Ignores its signal: it goes on and returns after the attempt is over.
            await sleep(1500);
            lateReturned = true;
            return 'late';
          }
          return 'fast';
        },
      },
    });
    const plan: PlanInput = {
      name: 'timeout',
      steps: [{ id: 'work', kind: 'operator', operator: 'slow', timeoutMs: 200, retry: RETRY }],
    };
    const run = await runtime.start(plan);
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced).toEqual({ work: 'fast' });
    expect(done.steps[0]).toMatchObject({ attempt: 2, status: 'SUCCEEDED' });
    expect(invoked.map((i) => i.attempt)).toEqual([1, 2]);
    // Attempt 1's signal was aborted with the timeout.
    expect(invoked[0]!.reason).toMatchObject({ code: 'timeout', retryable: true });
    expect(failures(await events(run.runId))).toMatchObject([
      { attempt: 1, error: { code: 'timeout', retryable: true, name: 'StepTimeoutError' } },
    ]);
    // Attempt 1 returns later: nothing of it is committed.
    for (let i = 0; i < 100 && !lateReturned; i++) await sleep(50);
    expect(lateReturned).toBe(true);
    await sleep(100);
    const after = await run.status();
    expect(after.summary.produced).toEqual({ work: 'fast' });
    expect(after.version).toBe(done.version);
    const succeeded = (await events(run.runId)).filter((e) => e.type === 'step.succeeded');
    expect(succeeded.map((e) => e.data)).toMatchObject([{ attempt: 2 }]);
  });

  it('fails the step when every attempt times out (retries exhausted), though each would succeed given time', async () => {
    let invocations = 0;
    await start({
      operators: {
        slow: async (ctx) => {
          invocations++;
          await new Promise<void>((ok, fail) => {
            const t = setTimeout(ok, 1500);
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
      name: 'timeout-final',
      steps: [{ id: 'work', kind: 'operator', operator: 'slow', timeoutMs: 200, retry: RETRY }],
    });
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(done.summary.blockedStep).toBe('work');
    expect(done.summary.reason).toBe('retries_exhausted');
    expect(done.summary.detail).toMatchObject({ code: 'timeout', details: { timeoutMs: 200 } });
    expect(invocations).toBe(2);
    expect(failures(await events(run.runId)).map((f) => [f.attempt, f.error.code])).toEqual([
      [1, 'timeout'],
      [2, 'timeout'],
    ]);
  });

  it('leaves a tool still running at the timeout in doubt, like a dead worker: not run again', async () => {
    let effects = 0;
    let release!: () => void;
    const held = new Promise<void>((ok) => (release = ok));
    const charge = defineTool({
      name: 'charge',
      input: z.object({ amount: z.number() }),
      idempotent: false,
      run: async ({ amount }) => {
        effects++;
        await held; // outlives the attempt, ignoring its signal
        return { charged: amount };
      },
    });
    await start(
      {
        tools: [charge],
        operators: { pay: async (ctx) => ctx.tools.call('charge', { amount: 5 }) },
      },
      300,
    );
    const run = await runtime.start({
      name: 'timeout-tool',
      steps: [
        {
          id: 'pay',
          kind: 'operator',
          operator: 'pay',
          timeoutMs: 200,
          retry: { ...RETRY, maxAttempts: 3 },
        },
      ],
    });
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('failed');
    expect(done.summary.blockedStep).toBe('pay');
    expect(done.summary.reason).toBe('tool_outcome_unknown');
    expect(effects).toBe(1);
    const [entry] = await runtime.ledger(run.runId);
    expect(entry).toMatchObject({ state: 'IN_DOUBT', runs: 1 });
    expect(failures(await events(run.runId)).map((f) => f.error.code)).toEqual([
      'timeout',
      'tool_outcome_unknown',
    ]);
    // The tool ends after all: its outcome is recorded (the truth for whoever resolves the call).
    release();
    for (let i = 0; i < 100; i++) {
      if ((await runtime.ledger(run.runId))[0]?.state === 'SUCCEEDED') break;
      await sleep(20);
    }
    expect((await runtime.ledger(run.runId))[0]).toMatchObject({
      state: 'SUCCEEDED',
      receipt: { charged: 5 },
    });
    expect(effects).toBe(1);
  });

  it('a timeoutMs longer than a Node timer can hold (about 24.8 days) does not fire early', async () => {
    await start({
      operators: {
        quick: async () => {
          await sleep(50);
          return 'done';
        },
      },
    });
    const run = await runtime.start({
      name: 'long-timeout',
      steps: [
        {
          id: 'work',
          kind: 'operator',
          operator: 'quick',
          timeoutMs: 3_000_000_000,
          budgets: { maxWallClockMs: 4_000_000_000 },
          retry: RETRY,
        },
      ],
    });
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('succeeded');
    expect(done.steps[0]).toMatchObject({ attempt: 1 });
  });

  it('bounds one turn of a granular agent step: the turn is cut off and the next attempt asks again', async () => {
    const agent = defineAgent({
      name: 'writer',
      model: 'gpt-4o-mini',
      provider: { baseURL: model.url, apiKey: 'test-key' },
      systemPrompt: 'Write.',
      timeoutMs: 10_000,
    });
    await start({ agents: [agent] });
    // The first request waits far longer than the turn may take.
    model.enqueue({ fault: 'delay', ms: 8000, then: { text: 'too late' } }, { text: 'Done.' });
    const run = await runtime.start(
      {
        name: 'turn-timeout',
        steps: [
          {
            id: 'write',
            kind: 'agent',
            agent: 'writer',
            mode: 'granular',
            timeoutMs: 2500,
            retry: RETRY,
          },
        ],
      },
      'Go.',
    );
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.summary).toMatchObject({ status: 'succeeded', detail: null });
    expect(model.requests[0]!.answered).toBe(false);
    expect(done.steps[0]).toMatchObject({ attempt: 2 });
    expect(done.summary.produced['write']).toMatchObject({ answer: 'Done.' });
    expect(model.requestCount).toBe(2);
    expect(failures(await events(run.runId)).map((f) => [f.attempt, f.error.code])).toEqual([
      [1, 'timeout'],
    ]);
  });

  describe('an atomic agent step', () => {
    const writer = () =>
      defineAgent({
        name: 'writer',
        model: 'gpt-4o-mini',
        provider: { baseURL: model.url, apiKey: 'test-key' },
        systemPrompt: 'Write.',
        // The agent's own model-call timeout is far longer: the step's timeoutMs is what fires.
        timeoutMs: 20_000,
      });
    const plan = (maxAttempts: number): PlanInput => ({
      name: 'atomic-timeout',
      steps: [
        {
          id: 'write',
          kind: 'agent',
          agent: 'writer',
          timeoutMs: 1500,
          retry: { ...RETRY, maxAttempts },
        },
      ],
    });

    it('bounds one attempt: a model reply slower than timeoutMs fails it with timeout, and the retry asks again', async () => {
      await start({ agents: [writer()] });
      model.enqueue({ fault: 'delay', ms: 8000, then: { text: 'too late' } }, { text: 'Done.' });
      const run = await runtime.start(plan(2), 'Go.');
      const done = await run.settled({ timeoutMs: 20_000 });
      expect(done.summary).toMatchObject({ status: 'succeeded', detail: null });
      expect(done.steps[0]).toMatchObject({ status: 'SUCCEEDED', attempt: 2 });
      expect(done.summary.produced['write']).toMatchObject({ answer: 'Done.' });
      // One request per attempt: the first was cut off unanswered.
      expect(model.requestCount).toBe(2);
      expect(model.requests[0]!.answered).toBe(false);
      expect(failures(await events(run.runId))).toMatchObject([
        { attempt: 1, error: { code: 'timeout', retryable: true, name: 'StepTimeoutError' } },
      ]);
    });

    it('fails the step once every attempt timed out (retries exhausted), one model request each', async () => {
      await start({ agents: [writer()] });
      const slow = { fault: 'delay' as const, ms: 8000, then: { text: 'too late' } };
      model.enqueue(slow, slow, { text: 'never asked' });
      const run = await runtime.start(plan(2), 'Go.');
      const done = await run.settled({ timeoutMs: 20_000 });
      expect(done.status).toBe('failed');
      expect(done.summary).toMatchObject({
        blockedStep: 'write',
        reason: 'retries_exhausted',
        detail: { code: 'timeout', details: { timeoutMs: 1500 } },
      });
      expect(model.requestCount).toBe(2);
      expect(failures(await events(run.runId)).map((f) => [f.attempt, f.error.code])).toEqual([
        [1, 'timeout'],
        [2, 'timeout'],
      ]);
    });
  });
});
