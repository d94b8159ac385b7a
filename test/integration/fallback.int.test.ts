/**
 * Fallback steps on a real Redis and the scripted model server: the fallback runs once the primary
 * failed finally, its attempt numbered after the primary's, told the primary's error; the primary's
 * usage is settled before the fallback's first model call; both failing fails the step naming both.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineTool,
  type FlujoWorker,
  type OperatorContext,
  type PlanInput,
  type Runtime,
  type StepOutcome,
} from '../../src/index.js';
import type { ScriptEntry } from '../../src/testing/index.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';
import { scriptedAgent, useScriptedModel } from '../helpers/scripted-agent.js';
import { runtimeCore } from '../../src/runtime.js';

const model = useScriptedModel();
let runtime: Runtime;
let worker: FlujoWorker | undefined;
let prefix: string;

const quiet = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };
const retry = { maxAttempts: 3, initialDelayMs: 10, maxDelayMs: 20, jitter: 0 };
const PRIMARY_MESSAGE = 'upstream said: "quota exhausted" (code 7) — try later';

const planOf = (step: Record<string, unknown>): PlanInput => ({
  name: 'fallbacks',
  steps: [{ id: 'work', kind: 'operator', operator: 'primary', retry, ...step }],
});

async function startWorker(): Promise<void> {
  // A long lock: the first model call of a process loads its tokenizer, which must not look like
  // a stalled job (a redelivered attempt would ask the model twice).
  worker = runtime.createWorker({ concurrency: 2, recoveryMs: 10_000 });
  await worker.ready();
}

async function outcomesOf(runId: string): Promise<StepOutcome[]> {
  const out: StepOutcome[] = [];
  for await (const o of runtime.outcomes(runId)) out.push(o);
  return out;
}

beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  runtime = createRuntime({ redis: redisUrl(), prefix, logger: quiet });
});
afterEach(async () => {
  await worker?.close();
  worker = undefined;
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('fallback steps', () => {
  it('runs the fallback operator once after 3 failed attempts, told the primary error verbatim', async () => {
    const primaryAttempts: number[] = [];
    const fallbackCalls: OperatorContext[] = [];
    runtime
      .operator('primary', ({ attempt }) => {
        primaryAttempts.push(attempt);
        throw Object.assign(new Error(PRIMARY_MESSAGE), { retryable: true });
      })
      .operator('backup', (ctx) => {
        fallbackCalls.push(ctx);
        return { from: 'backup', primaryError: ctx.fallbackOf?.error.message ?? null };
      });
    await startWorker();
    const run = await runtime.start(planOf({ fallback: { operator: 'backup' } }), { q: 1 });
    const report = await run.settled({ timeoutMs: 10_000 });

    expect(report.status).toBe('succeeded');
    expect(primaryAttempts).toEqual([1, 2, 3]);
    expect(fallbackCalls).toHaveLength(1);
    expect(fallbackCalls[0]!.attempt).toBe(4);
    expect(fallbackCalls[0]!.fallbackOf?.error.message).toBe(PRIMARY_MESSAGE);
    const step = report.steps[0]!;
    expect(step).toMatchObject({ status: 'SUCCEEDED', attempt: 4 });
    expect(step.output).toEqual({ from: 'backup', primaryError: PRIMARY_MESSAGE });
    expect(step.fallback).toMatchObject({
      active: true,
      primaryError: { message: PRIMARY_MESSAGE },
    });

    const outcomes = await outcomesOf(run.runId);
    expect(outcomes.map((o) => [o.type, 'attempt' in o ? o.attempt : null])).toEqual([
      ['failure', 1],
      ['failure', 2],
      ['failure', 3],
      ['success', 4],
    ]);
    expect(outcomes.at(-1)).toMatchObject({ producedBy: 'fallback' });
    expect(outcomes.slice(0, 3).map((o) => o.type === 'failure' && o.final)).toEqual([
      false,
      false,
      false,
    ]);
  });

  it('a primary that succeeds is marked producedBy primary; the fallback never runs', async () => {
    let fallbackRuns = 0;
    runtime
      .operator('primary', () => ({ ok: true }))
      .operator('backup', () => {
        fallbackRuns++;
        return null;
      });
    await startWorker();
    const run = await runtime.start(planOf({ fallback: { operator: 'backup' } }));
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    expect(fallbackRuns).toBe(0);
    expect((await outcomesOf(run.runId)).at(-1)).toMatchObject({
      type: 'success',
      attempt: 1,
      producedBy: 'primary',
    });
  });

  it('both failing fails the step with an error naming both', async () => {
    let fallbackRuns = 0;
    runtime
      .operator('primary', () => {
        throw Object.assign(new Error(PRIMARY_MESSAGE), { retryable: false });
      })
      .operator('backup', () => {
        fallbackRuns++;
        throw Object.assign(new Error('backup store offline'), { retryable: true });
      });
    await startWorker();
    const run = await runtime.start(planOf({ fallback: { operator: 'backup' } }));
    const report = await run.settled({ timeoutMs: 10_000 });
    expect(report.status).toBe('failed');
    // A non-retryable primary error goes straight to the fallback; the fallback runs once.
    expect(fallbackRuns).toBe(1);
    const step = report.steps[0]!;
    expect(step).toMatchObject({ status: 'FAILED_FINAL', attempt: 2, reason: 'fallback_failed' });
    expect(step.error).toMatchObject({ name: 'FallbackFailedError', code: 'fallback_failed' });
    expect(step.error!.message).toContain(PRIMARY_MESSAGE);
    expect(step.error!.message).toContain('backup store offline');
  });

  it('refuses a start whose fallback names an unregistered operator, writing nothing', async () => {
    runtime.operator('primary', () => null).operator('backup', () => null);
    await expect(
      runtime.start(planOf({ fallback: { operator: 'bakcup' } }), null, { runId: 'r-refused' }),
    ).rejects.toThrow(/steps\[0\]\.fallback\.operator: no operator "bakcup" is registered/);
    await expect(
      runtime.start(planOf({ fallback: { agent: 'writer' } }), null, { runId: 'r-refused' }),
    ).rejects.toThrow(/no agent "writer" is registered.*runtime\.agent/);
    expect(
      await runtimeCore(runtime).redis.exists(runtimeCore(runtime).stores.keys.snap('r-refused')),
    ).toBe(0);
  });

  it('a granular agent primary falls back to an operator, run as one step job', async () => {
    const broken = defineTool({
      name: 'lookup',
      input: z.object({ q: z.string() }),
      run: () => {
        throw Object.assign(new Error('index corrupt'), { retryable: false });
      },
    });
    runtime
      .agent(
        scriptedAgent(model, {
          name: 'researcher',
          model: 'gpt-4o-mini',
          systemPrompt: 'Research.',
          tools: [broken],
        }),
      )
      .operator('backup', (ctx) => ({ fallbackFor: ctx.fallbackOf?.error.code ?? null }));
    model.enqueue({ toolCalls: [{ name: 'lookup', arguments: { q: 'x' } }] });
    await startWorker();
    const run = await runtime.start({
      name: 'granular-fallback',
      steps: [
        {
          id: 'g',
          kind: 'agent',
          agent: 'researcher',
          mode: 'granular',
          retry,
          fallback: { operator: 'backup' },
        },
      ],
    });
    const report = await run.settled({ timeoutMs: 10_000 });
    expect(report.status).toBe('succeeded');
    expect(model.requestCount).toBe(1);
    // The turn's final error (not retryable) goes straight to the fallback: attempt 2.
    expect(report.steps[0]).toMatchObject({
      attempt: 2,
      output: { fallbackFor: 'unknown' },
      fallback: { active: true, primaryError: { code: 'unknown', retryable: false } },
    });
    expect(report.steps[0]!.fallback!.primaryError!.message).toContain('index corrupt');
  });

  it('an agent primary: its usage is settled before the fallback agent is asked, which is told the error', async () => {
    const flaky = defineTool({
      name: 'lookup',
      input: z.object({ q: z.string() }),
      run: () => {
        throw Object.assign(new Error(PRIMARY_MESSAGE), { status: 503 });
      },
    });
    const agent = (name: string, tools = [flaky]) =>
      scriptedAgent(model, {
        name,
        model: 'gpt-4o-mini',
        systemPrompt: `You are ${name}.`,
        tools,
        settings: { maxTokens: 50 },
      });
    runtime.agent(agent('researcher')).agent(agent('summarizer', []));
    // Replies by agent: an attempt may be executed more than once (at-least-once), so the
    // script must not depend on how many calls the primary makes. Each call of the primary gets
    // other arguments: a call of its own in the ledger.
    let n = 0;
    const reply: ScriptEntry = (request) => {
      const system = String((request.messages[0] as { content?: unknown } | undefined)?.content);
      if (system.includes('summarizer')) {
        return { text: 'From memory: 42.', usage: { prompt_tokens: 70, completion_tokens: 5 } };
      }
      return {
        toolCalls: [{ id: 'c1', name: 'lookup', arguments: { q: `q${n++}` } }],
        usage: { prompt_tokens: 40, completion_tokens: 6 },
      };
    };
    model.script(Array.from({ length: 12 }, () => reply));
    await startWorker();
    const run = await runtime.start(
      {
        name: 'agent-fallback',
        steps: [
          {
            id: 'answer',
            kind: 'agent',
            agent: 'researcher',
            retry,
            fallback: { agent: 'summarizer' },
          },
        ],
      },
      'What is the answer?',
    );
    const report = await run.settled({ timeoutMs: 15_000 });
    expect(report.status).toBe('succeeded');
    expect(report.steps[0]).toMatchObject({
      attempt: 4,
      output: { answer: 'From memory: 42.' },
      fallback: { active: true },
    });
    const fallbackRequest = model.requests.at(-1)!;
    expect(String((fallbackRequest.messages[0] as { content: unknown }).content)).toContain(
      'summarizer',
    );
    const userTexts = fallbackRequest.messages
      .filter((m) => (m as { role: string }).role === 'user')
      .map((m) => String((m as { content: unknown }).content));
    expect(userTexts[0]).toBe('What is the answer?');
    // The primary's error message, verbatim (as committed, with its classification note).
    const primaryError = report.steps[0]!.fallback!.primaryError!.message;
    expect(primaryError).toContain(PRIMARY_MESSAGE);
    expect(userTexts[1]).toContain(primaryError);

    const { reservations } = await runtime.usage(run.runId);
    // In the order they were made: the primary's calls, then the fallback's one call.
    const primary = reservations.slice(0, -1);
    const fallback = reservations.at(-1)!;
    expect(primary.length).toBeGreaterThanOrEqual(3);
    // Every call of the primary was charged its provider usage before the fallback reserved and
    // sent its first call.
    for (const r of primary) {
      expect([r.state, r.charged?.tokens]).toEqual(['reconciled', 46]);
      expect(r.reconciledAt!).toBeLessThanOrEqual(fallback.createdAt);
      expect(r.reconciledAt!).toBeLessThanOrEqual(fallbackRequest.at);
    }
    expect(fallback.charged?.tokens).toBe(75);
  });
});
