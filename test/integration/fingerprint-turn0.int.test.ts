/**
 * The resume fingerprint from turn 0: an agent step whose first turn holds a tool call for a
 * person's approval has persisted something (its reservation, its journaled reply, the held call)
 * without committing a turn. A worker of a job whose system prompt, price or policy version
 * changed meanwhile must not resume it: the run fails with the fingerprint's ResumeError, naming
 * the change, and the model is asked nothing more. Granular and atomic steps, real workers on the
 * scripted model server.
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
} from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { settledReport } from '../helpers/agent-child.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';

/** Payments that happened. */
let paid: number[];

const pay = defineTool({
  name: 'pay',
  input: z.object({ cents: z.number().int().positive(), idempotency_key: z.string().optional() }),
  class: 'external',
  requiresIdempotencyKey: true,
  riskLevel: 'high',
  run: ({ cents }) => {
    paid.push(cents);
    return { paid: cents };
  },
});

/** What a job may change between the pause and the resume. */
interface JobSettings {
  systemPrompt: string;
  inputPrice?: number;
  policyVersion?: string;
}

const BASE: JobSettings = {
  systemPrompt: 'Pay what is asked.',
  inputPrice: 0.15,
  policyVersion: '2026-10',
};

let model: ScriptedModelServer;
let prefix: string;
const open: { runtime: Runtime; worker: FlujoWorker }[] = [];

beforeAll(async () => {
  model = await startScriptedModelServer();
});
afterAll(async () => {
  await model.close();
});
beforeEach(() => {
  model.reset();
  paid = [];
  prefix = `t-${randomUUID().slice(0, 8)}`;
});
afterEach(async () => {
  for (const { runtime, worker } of open.splice(0)) {
    await worker.close();
    await runtime.close();
  }
  await deleteRuntimeKeys(prefix);
});

/** A runtime of the job with `settings`, and its worker. */
async function job(settings: JobSettings): Promise<{ runtime: Runtime; worker: FlujoWorker }> {
  const cashier = defineAgent({
    name: 'cashier',
    model: 'gpt-test',
    provider: { baseURL: model.url, apiKey: 'test-key' },
    systemPrompt: settings.systemPrompt,
    tools: [pay],
    timeoutMs: 2000,
  });
  const price = settings.inputPrice;
  const runtime = createRuntime({
    redis: redisUrl(),
    prefix,
    logger: silentLogger,
    tools: [pay],
    ...(settings.policyVersion === undefined ? {} : { policyVersion: settings.policyVersion }),
    ...(price === undefined
      ? {}
      : {
          pricing: {
            models: { 'gpt-test': { inputPerMillion: price, outputPerMillion: 2 * price } },
          },
        }),
  }).agent(cashier);
  const worker = runtime.createWorker({ concurrency: 2, recoveryMs: 1000 });
  await worker.ready();
  const both = { runtime, worker };
  open.push(both);
  return both;
}

async function stop(j: { runtime: Runtime; worker: FlujoWorker }): Promise<void> {
  open.splice(open.indexOf(j), 1);
  await j.worker.close();
  await j.runtime.close();
}

const plan = (mode: 'atomic' | 'granular'): PlanInput => ({
  name: `pay-${mode}`,
  steps: [{ id: 'pay', kind: 'agent', agent: 'cashier', mode, maxTurns: 4 }],
});

/**
 * Starts a run whose turn 0 holds its call of `pay` for approval under `before`, stops that job,
 * and approves and resumes the run with a job of settings `after`. Returns the settled report and
 * how many requests the model got after the pause.
 */
async function pauseAndResume(mode: 'atomic' | 'granular', after: JobSettings) {
  model.enqueue({ toolCalls: [{ name: 'pay', arguments: { cents: 300 } }] }, { text: 'Paid.' });
  const first = await job(BASE);
  const runId = `run-${randomUUID().slice(0, 8)}`;
  await first.runtime.start(plan(mode), 'Pay 300.', { runId });
  const waiting = await settledReport(first.runtime, runId);
  expect(waiting.status).toBe('waiting');
  expect(waiting.approvals[0]!.call).toMatchObject({ tool: 'pay@1', args: { cents: 300 } });
  expect(model.requestCount).toBe(1);
  await stop(first);

  const second = await job(after);
  await second.runtime.approve(runId, 'pay', { by: 'ana' });
  const report = await settledReport(second.runtime, runId);
  return { report, requestsAfterPause: model.requestCount - 1 };
}

describe.each(['granular', 'atomic'] as const)('a %s agent step held at its first turn', (mode) => {
  it.each([
    [
      'its system prompt',
      'systemPrompt',
      { systemPrompt: 'Pay twice what is asked.' },
      /system prompt changed/,
    ],
    ['the price of its model', 'pricing', { inputPrice: 0.3 }, /pric/],
    ['the policy version', 'policyVersion', { policyVersion: '2026-11' }, /polic/i],
  ] as const)(
    'resumed by a job that changed %s: the run fails with the fingerprint error, nothing more is asked or paid',
    async (_what, field, change, message) => {
      const { report, requestsAfterPause } = await pauseAndResume(mode, { ...BASE, ...change });
      expect(report.status).toBe('failed');
      expect(report.summary.reason).toBe('resume_error');
      const error = report.steps[0]!.error!;
      expect(error).toMatchObject({ code: 'resume_error', retryable: false });
      expect(error.details).toMatchObject({ recoverable: false, field });
      expect(error.message).toMatch(/fingerprint mismatch/);
      expect(error.message).toMatch(message);
      expect(requestsAfterPause).toBe(0);
      expect(paid).toEqual([]);
    },
  );

  it('resumed by the same job: the approved call runs once and the run succeeds', async () => {
    const { report, requestsAfterPause } = await pauseAndResume(mode, BASE);
    expect(report.status).toBe('succeeded');
    expect(report.summary.produced['pay']).toMatchObject({ answer: 'Paid.', turns: 2 });
    expect(requestsAfterPause).toBe(1);
    expect(paid).toEqual([300]);
  });
});
