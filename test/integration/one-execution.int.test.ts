/**
 * One live execution per unit: outside crash recovery, a step attempt or an agent turn is executed
 * by at most one job at a time. Counted at the operators, the tools and the model server (what
 * happened), not only in the committed snapshot (what was kept): fan-outs, a diamond and parallel
 * atomic agents, with chained units on and off.
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  type FlujoWorker,
  type OperatorContext,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';

/** Invocations of each operator, by run and step. */
const invoked = new Map<string, number>();
const count = (runId: string, stepId: string) => invoked.get(`${runId}/${stepId}`) ?? 0;

/** Logs each call, and sleeps a little so that sibling steps overlap in time. */
async function logged(ctx: OperatorContext) {
  const key = `${ctx.runId}/${ctx.stepId}`;
  invoked.set(key, (invoked.get(key) ?? 0) + 1);
  await sleep(5 + Math.floor(Math.random() * 15));
  return { step: ctx.stepId };
}

function fanOut(width: number): PlanInput {
  const leaves = Array.from({ length: width }, (_, i) => `leaf${i}`);
  return {
    name: `fan-out-${width}`,
    steps: [
      { id: 'root', kind: 'operator', operator: 'logged' },
      ...leaves.map((id) => ({
        id,
        kind: 'operator' as const,
        operator: 'logged',
        dependsOn: ['root'],
      })),
    ],
  };
}

const diamond: PlanInput = {
  name: 'diamond',
  steps: [
    { id: 'a', kind: 'operator', operator: 'logged' },
    { id: 'b', kind: 'operator', operator: 'logged', dependsOn: ['a'] },
    { id: 'c', kind: 'operator', operator: 'logged', dependsOn: ['a'] },
    { id: 'd', kind: 'operator', operator: 'logged', dependsOn: ['b', 'c'] },
    { id: 'e', kind: 'operator', operator: 'logged', dependsOn: ['d'] },
  ],
};

const stepIds = (plan: PlanInput) => plan.steps.map((s) => s.id);

describe.each([
  { chain: 'chained units', chainMs: 1000, workers: 1 },
  { chain: 'one job per unit', chainMs: 0, workers: 1 },
  { chain: 'chained units, two workers', chainMs: 1000, workers: 2 },
])('one execution per step attempt ($chain)', ({ chainMs, workers: n }) => {
  let runtime: Runtime;
  let workers: FlujoWorker[];
  let prefix: string;

  beforeAll(async () => {
    prefix = `t-${randomUUID().slice(0, 8)}`;
    runtime = createRuntime({ redis: redisUrl(), prefix }).operator('logged', logged);
    workers = Array.from({ length: n }, () =>
      runtime.createWorker({ concurrency: 8, chainMs, recoveryMs: 4000 }),
    );
    await Promise.all(workers.map((w) => w.ready()));
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.close()));
    await runtime.close();
    await deleteRuntimeKeys(prefix);
  });

  const cases: [string, PlanInput][] = [
    [
      'root → left, right',
      {
        name: 'two-way',
        steps: [
          { id: 'root', kind: 'operator', operator: 'logged' },
          { id: 'left', kind: 'operator', operator: 'logged', dependsOn: ['root'] },
          { id: 'right', kind: 'operator', operator: 'logged', dependsOn: ['root'] },
        ],
      },
    ],
    ['a fan-out of 8', fanOut(8)],
    ['a diamond with a tail', diamond],
  ];

  it.each(cases)('%s: every operator runs exactly once, over 10 runs at once', async (_, plan) => {
    const handles = await Promise.all(
      Array.from({ length: 10 }, () => runtime.start(plan, { n: 1 })),
    );
    const reports = await Promise.all(handles.map((h) => h.settled({ timeoutMs: 20_000 })));
    for (const [i, report] of reports.entries()) {
      expect(report.status).toBe('succeeded');
      const runId = handles[i]!.runId;
      const counts = Object.fromEntries(stepIds(plan).map((id) => [id, count(runId, id)]));
      expect(counts).toEqual(Object.fromEntries(stepIds(plan).map((id) => [id, 1])));
    }
  });
});

describe('parallel atomic agents that each send one e-mail', () => {
  let model: ScriptedModelServer;
  let runtime: Runtime;
  let worker: FlujoWorker;
  let prefix: string;
  const sent: { to: string; body: string }[] = [];

  beforeAll(async () => {
    model = await startScriptedModelServer();
    prefix = `t-${randomUUID().slice(0, 8)}`;
    const sendEmail = defineTool({
      name: 'send_email',
      class: 'external',
      requiresIdempotencyKey: true,
      input: z.object({ to: z.string(), body: z.string() }),
      run: async (args) => {
        sent.push(args);
        await sleep(10);
        return { sent: true };
      },
    });
    const writer = defineAgent({
      name: 'writer',
      model: 'gpt-test',
      provider: { baseURL: model.url, apiKey: 'test-key' },
      systemPrompt: 'Write one e-mail and send it.',
      tools: [sendEmail],
      timeoutMs: 5000,
    });
    runtime = createRuntime({ redis: redisUrl(), prefix }).agent(writer).operator('logged', logged);
    worker = runtime.createWorker({ concurrency: 8 });
    await worker.ready();
  });
  afterAll(async () => {
    await worker.close();
    await runtime.close();
    await model.close();
    await deleteRuntimeKeys(prefix);
  });

  afterEach(() => {
    model.reset();
    sent.length = 0;
  });

  it('two agents after a root: two e-mails and four model calls, not more', async () => {
    let drafts = 0;
    // Like a real model, each draft is worded a little differently: a second execution of a
    // step would send a second, different e-mail rather than meet the first one's receipt.
    const reply = (request: { messages: readonly { role: string; content?: unknown }[] }) => {
      const last = request.messages[request.messages.length - 1]!;
      if (last.role === 'tool') return { text: 'Sent.' };
      const user = JSON.stringify(request.messages.find((m) => m.role === 'user')?.content ?? '');
      const to = user.includes('left') ? 'left@example.com' : 'right@example.com';
      drafts++;
      return {
        toolCalls: [{ name: 'send_email', arguments: { to, body: `Hello (draft ${drafts})` } }],
      };
    };
    model.enqueue(...Array.from({ length: 20 }, () => reply));
    const plan: PlanInput = {
      name: 'two-mails',
      steps: [
        { id: 'root', kind: 'operator', operator: 'logged' },
        { id: 'left', kind: 'agent', agent: 'writer', dependsOn: ['root'], input: 'to left' },
        { id: 'right', kind: 'agent', agent: 'writer', dependsOn: ['root'], input: 'to right' },
      ],
    };
    const run = await runtime.start(plan, { n: 1 });
    const done = await run.settled({ timeoutMs: 20_000 });
    expect(done.status).toBe('succeeded');
    expect(count(run.runId, 'root')).toBe(1);
    expect(sent.map((m) => m.to).sort()).toEqual(['left@example.com', 'right@example.com']);
    expect(model.requestCount).toBe(4);
  });
});
