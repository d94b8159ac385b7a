/**
 * Usage, events and trace tell the same story of an atomic agent step's model calls, across a
 * SIGKILL at each point of the step (a worker child of test/fixtures/agent-child.ts dies there,
 * another resumes the run) and across a pause for a tool call's approval: the requests the
 * scripted model server received = the reservations `usage` lists as charged calls = the run's
 * `model.called` events = the model spans of its trace. A reservation that sent no request is
 * listed as released, never as a call.
 */
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { usageLines } from '../../src/cli/render.js';
import {
  createRuntime,
  defineAgent,
  defineTool,
  type FlujoWorker,
  type PlanInput,
} from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { createRuntime as createBareRuntime, type Runtime } from '../../src/runtime.js';
import {
  agentChildren,
  crashAndResume,
  scriptThreeTurns,
  settledReport,
} from '../helpers/agent-child.js';
import { expectIntact } from '../helpers/integrity.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';
import { useScriptedModel } from '../helpers/scripted-agent.js';

const model = useScriptedModel();
let rt: Runtime;
let prefix: string;
let dir: string;

const plan: PlanInput = {
  name: 'atomic-usage-crash',
  steps: [
    {
      id: 'research',
      kind: 'agent',
      agent: 'researcher',
      mode: 'atomic',
      retry: { maxAttempts: 3, initialDelayMs: 50, maxDelayMs: 200, jitter: 0 },
    },
  ],
};

/** What each source says of the run's model calls. */
interface Story {
  /** Requests the model server received for the run. */
  requests: number;
  /** Reservations `usage` lists as charged calls (`usage` or `baseline`). */
  usageCalls: number;
  /** Reservations `usage` lists as released (nothing sent). */
  released: number;
  /** Reservations left open. */
  open: number;
  /** `model.called` events. */
  events: number;
  /** Model spans of the run's trace. */
  spans: number;
  /** The `flujo usage` rows that say a reservation was released (nothing sent). */
  linesReleased: number;
  /** The `flujo usage` line that counts the calls. */
  callsLine: string;
}

async function storyOf(runtime: Runtime, runId: string, input: string): Promise<Story> {
  const usage = await runtime.usage(runId);
  const events: string[] = [];
  for await (const e of runtime.events(runId)) events.push(e.type);
  const trace = await runtime.trace(runId);
  const of = (o: string | null) => usage.reservations.filter((r) => r.outcome === o).length;
  return {
    requests: model.requests.filter(
      (r) => r.messages.find((m) => m.role === 'user')?.content === input,
    ).length,
    usageCalls: of('usage') + of('baseline'),
    released: of('none'),
    open: of(null),
    events: events.filter((t) => t === 'model.called').length,
    spans: trace.steps.flatMap((s) => s.attempts.flatMap((a) => a.modelCalls)).length,
    linesReleased: usageLines(usage).filter((l) => l.includes('released (nothing sent')).length,
    callsLine: usageLines(usage).find((l) => l.startsWith('model calls: ')) ?? '',
  };
}

/** The story told the same way by every source: one number of calls, and the released ones. */
function expectOneStory(s: Story): void {
  expect(s.open, 'no reservation left open').toBe(0);
  expect({ usage: s.usageCalls, events: s.events, spans: s.spans }).toEqual({
    usage: s.requests,
    events: s.requests,
    spans: s.requests,
  });
  expect(s.linesReleased).toBe(s.released);
  expect(s.callsLine).toBe(`model calls: ${s.requests}; released without a call: ${s.released}`);
}

/**
 * Worker child processes on this test's prefix, model server and effect file (with `extra` in
 * their environment), and a fresh prefix, directory and runtime for each test.
 */
function workerChildren(extra: Record<string, string>): ReturnType<typeof agentChildren> {
  const children = agentChildren(() => ({
    REDIS_URL: redisUrl(),
    FLUJO_PREFIX: prefix,
    MODEL_URL: model.url,
    EFFECT_FILE: join(dir, 'effects.log'),
    RECOVERY_MS: '1000',
    INPUT_PRICE: '0.15',
    ...extra,
  }));
  beforeEach(async () => {
    scriptThreeTurns(model);
    prefix = testPrefix();
    dir = await mkdtemp(join(tmpdir(), 'flujo-atomic-usage-'));
    rt = createBareRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
  });
  afterEach(async () => {
    await children.killAll();
    await rt.close();
    await deleteRuntimeKeys(prefix);
    await rm(dir, { recursive: true, force: true });
  });
  return children;
}

const matrix: Record<string, Story> = {};

describe('an atomic agent step killed at each point: usage, events and trace agree', () => {
  const children = workerChildren({});
  afterAll(() => {
    // The matrix, for whoever reads the test's output.
    process.stdout.write(
      ['kill point | requests | usage calls | released | model.called | trace spans']
        .concat(
          Object.entries(matrix).map(
            ([k, s]) =>
              `${k} | ${s.requests} | ${s.usageCalls} | ${s.released} | ${s.events} | ${s.spans}`,
          ),
        )
        .join('\n') + '\n',
    );
  });

  it.each([
    // Call 0 done (its reply journaled, its tools run); then, at call 1:
    ['before the reservation', 'before-reserve:research:1', 3, 0],
    ['after the reservation, before the request', 'after-reserve:research:1', 3, 1],
    ['after the request was sent, before the reply', 'after-request-sent@2', 4, 0],
    ['after the reply, before its tools', 'after-journal:research:1', 3, 0],
    ['after a tool', 'after-receipt:save_note@2', 3, 0],
    ['before the commit', 'before-commit:research', 3, 0],
    ['after the commit', 'after-commit:research', 3, 0],
  ])('killed %s', async (name, killAt, requests, released) => {
    const { runId, report } = await crashAndResume(rt, plan, children, killAt);
    expect(report.status).toBe('succeeded');
    const story = await storyOf(rt, runId, runId);
    matrix[`${name} (${killAt})`] = story;
    expect(story.requests).toBe(requests);
    expect(story.released).toBe(released);
    expectOneStory(story);
    await expectIntact(rt, runId);
  });
});

describe('an atomic agent step whose tool calls wait for approval in a worker process', () => {
  const children = workerChildren({ RISKY_NOTES: '1' });

  it('approved from another process, twice, and resumed: each call listed once', async () => {
    const runId = `run-${randomUUID().slice(0, 8)}`;
    await rt.start(plan, runId, { runId });
    const child = await children.spawn();
    for (const text of ['first', 'second']) {
      const waiting = await settledReport(rt, runId);
      expect(waiting.status).toBe('waiting');
      expect(waiting.approvals[0]!.call!.args).toMatchObject({ text });
      await rt.approve(runId, 'research', { by: 'ana' });
    }
    const done = await settledReport(rt, runId);
    child.proc.kill('SIGTERM');
    await child.exited;
    expect(done.status).toBe('succeeded');
    const story = await storyOf(rt, runId, runId);
    matrix['paused twice for approval (worker process), approved, resumed'] = story;
    expect(story.requests).toBe(3);
    expectOneStory(story);
  });
});

describe('an atomic agent step whose tool call waits for approval', () => {
  let runtime: Runtime;
  let worker: FlujoWorker;
  const paid: number[] = [];

  beforeEach(async () => {
    prefix = `t-${randomUUID().slice(0, 8)}`;
    const pay = defineTool({
      name: 'pay',
      input: z.object({ cents: z.number().int().positive() }),
      class: 'external',
      idempotent: false,
      riskLevel: 'high',
      run: ({ cents }) => {
        paid.push(cents);
        return { paid: cents };
      },
    });
    const cashier = defineAgent({
      name: 'cashier',
      model: 'gpt-test',
      provider: { baseURL: model.url, apiKey: 'test-key' },
      systemPrompt: 'Pay what is asked.',
      tools: [pay],
      timeoutMs: 2000,
    });
    runtime = createRuntime({
      redis: redisUrl(),
      prefix,
      logger: silentLogger,
      tools: [pay],
    }).agent(cashier);
    worker = runtime.createWorker({ concurrency: 2, recoveryMs: 1000 });
    await worker.ready();
  });
  afterEach(async () => {
    await worker.close();
    await runtime.close();
    await deleteRuntimeKeys(prefix);
  });

  it('approved and resumed: each model call listed once by usage, events and trace', async () => {
    model.enqueue(
      {
        toolCalls: [{ name: 'pay', arguments: { cents: 40 } }],
        usage: { prompt_tokens: 50, completion_tokens: 9 },
      },
      { text: 'Paid 40.', usage: { prompt_tokens: 80, completion_tokens: 4 } },
    );
    const plan: PlanInput = {
      name: 'pay-atomic',
      steps: [{ id: 'agent', kind: 'agent', agent: 'cashier', mode: 'atomic', maxTurns: 4 }],
    };
    const input = `Pay 40 (${randomUUID().slice(0, 8)}).`;
    const run = await runtime.start(plan, input);
    const waiting = await settledReport(runtime, run.runId);
    expect(waiting.status).toBe('waiting');
    const paused = await storyOf(runtime, run.runId, input);
    expect(paused).toMatchObject({ requests: 1, usageCalls: 1, events: 1, spans: 1 });
    await runtime.approve(run.runId, 'agent', { by: 'ana' });
    const done = await settledReport(runtime, run.runId);
    expect(done.status).toBe('succeeded');
    expect(paid).toEqual([40]);
    const story = await storyOf(runtime, run.runId, input);
    matrix['paused for approval, approved, resumed'] = story;
    expect(story.requests).toBe(2);
    expectOneStory(story);
    const usage = await runtime.usage(run.runId);
    expect(usage.reservations.map((r) => [r.turn, r.outcome, r.charged?.tokens])).toEqual([
      [0, 'usage', 59],
      [1, 'usage', 84],
    ]);
    expect(usage.totals.spentTokens).toBe(143);
  });
});
