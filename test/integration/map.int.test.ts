/**
 * Map steps on a real Redis: one item per element of a dependency's array, the output in element
 * order, at most maxConcurrency items at a time, each item with its own retries, ledger scope and
 * idempotency key; an item that fails finally fails the map (`item_failed`, naming the index)
 * unless failures are collected; a list that is not an array fails the map clearly; a map over a
 * step that is not an ancestor is refused with nothing written; the map's keys expire with the run.
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  PlanValidationError,
  type FlujoWorker,
  type JsonValue,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { runFlujo } from '../helpers/cli.js';
import { expectIntact } from '../helpers/integrity.js';
import { connect, deleteRuntimeKeys, redisUrl, scanKeys } from '../helpers/redis.js';

let runtime: Runtime;
let worker: FlujoWorker | undefined;
let prefix: string;

const quiet = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };

const mapPlan = (over: JsonValue, map: Record<string, unknown> = {}): PlanInput => ({
  name: 'map',
  defaults: { retry: { initialDelayMs: 10, maxDelayMs: 50 } },
  steps: [
    { id: 'list', kind: 'operator', operator: 'list', input: over },
    {
      id: 'each',
      kind: 'map',
      over: 'list.items',
      item: { kind: 'operator', operator: 'double' },
      dependsOn: ['list'],
      ...map,
    },
    { id: 'after', kind: 'operator', operator: 'after', dependsOn: ['each'] },
  ],
});

async function runToEnd(plan: PlanInput, concurrency = 8) {
  worker = runtime.createWorker({ concurrency });
  await worker.ready();
  const run = await runtime.start(plan, {});
  const report = await run.settled({ timeoutMs: 30_000 });
  return { runId: run.runId, report };
}

let invocations: Map<number, number>;
let keys: Set<string>;
let running: number;
let most: number;

beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  runtime = createRuntime({ redis: redisUrl(), prefix, logger: quiet });
  invocations = new Map();
  keys = new Set();
  running = 0;
  most = 0;
  runtime
    .operator('list', ({ input }) => ({ items: input }))
    .operator('double', async ({ input, idempotencyKey, stepId }) => {
      const n = input as number;
      invocations.set(n, (invocations.get(n) ?? 0) + 1);
      keys.add(`${stepId} ${idempotencyKey}`);
      running++;
      most = Math.max(most, running);
      await new Promise((r) => setTimeout(r, 5));
      running--;
      if (n < 0 && invocations.get(n)! < 2) throw new Error(`transient ${n}`);
      if (n === 13) throw Object.assign(new Error('unlucky'), { retryable: false });
      return n * 2;
    })
    .operator('after', ({ deps }) => ({ saw: deps['each'] ?? null }));
});
afterEach(async () => {
  await worker?.close();
  worker = undefined;
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('map steps', () => {
  it('runs one item per element, in order, within maxConcurrency; retries an item alone', async () => {
    const list = Array.from({ length: 40 }, (_, i) => (i % 10 === 3 ? -i : i));
    const { runId, report } = await runToEnd(mapPlan(list, { maxConcurrency: 3 }));
    expect(report.status).toBe('succeeded');
    const each = report.steps.find((s) => s.stepId === 'each')!;
    expect(each.output).toEqual(list.map((n) => n * 2));
    // Every item once, but those that failed once (their retry: twice).
    for (const n of list) expect(invocations.get(n)).toBe(n < 0 ? 2 : 1);
    expect(most).toBeLessThanOrEqual(3);
    expect(most).toBeGreaterThan(1);
    // Each item its own id and idempotency key (with its index).
    expect(new Set([...keys].map((k) => k.split(' ')[0])).size).toBe(40);
    expect(new Set([...keys].map((k) => k.split(' ')[1])).size).toBe(40);
    expect([...keys].some((k) => k.startsWith('each.0 '))).toBe(true);
    const after = report.steps.find((s) => s.stepId === 'after')!;
    expect(after.output).toEqual({ saw: list.map((n) => n * 2) });
    await expectIntact(runtime, runId);
    // The map's keys expire with the run's.
    const redis = connect();
    try {
      const mapKeys = (await scanKeys(redis, `${prefix}*`)).filter((k) => k.includes(':map'));
      expect(mapKeys.length).toBeGreaterThan(0);
      for (const k of mapKeys) expect(await redis.pttl(k)).toBeGreaterThan(0);
    } finally {
      redis.disconnect();
    }
  });

  it('an item that fails finally fails the map with item_failed, naming the index', async () => {
    const { report } = await runToEnd(mapPlan([1, 2, 13, 4], { maxConcurrency: 1 }));
    expect(report.status).toBe('failed');
    const each = report.steps.find((s) => s.stepId === 'each')!;
    expect(each.status).toBe('FAILED_FINAL');
    expect(each.error?.code).toBe('item_failed');
    expect(each.error?.message).toContain('Item 2 of map step "each"');
    expect(each.error?.message).toContain('unlucky');
    // The items after it were never dispatched.
    expect(invocations.get(4)).toBeUndefined();
  });

  it('a resumed map runs only the items that failed or never ran; committed ones keep their outputs', async () => {
    const { runId, report } = await runToEnd(mapPlan([1, 2, 13, 4], { maxConcurrency: 1 }));
    expect(report.status).toBe('failed');
    expect([...invocations.entries()].sort((a, b) => a[0] - b[0])).toEqual([
      [1, 1],
      [2, 1],
      [13, 1],
    ]);
    // The cause fixed: 13 now succeeds.
    runtime.operator('double', ({ input }) => {
      const n = input as number;
      invocations.set(n, (invocations.get(n) ?? 0) + 1);
      return n * 2;
    });
    await runtime.resume(runId);
    const resumed = await (await runtime.attach(runId)).settled({ timeoutMs: 30_000 });
    expect(resumed.status).toBe('succeeded');
    expect(resumed.steps.find((s) => s.stepId === 'each')!.output).toEqual([2, 4, 26, 8]);
    // Items 1 and 2 were not run again; 13 ran once more, 4 once.
    expect([...invocations.entries()].sort((a, b) => a[0] - b[0])).toEqual([
      [1, 1],
      [2, 1],
      [4, 1],
      [13, 2],
    ]);
  });

  it('itemFailures collect: the failed item holds an error record, the map succeeds', async () => {
    const { report } = await runToEnd(mapPlan([1, 13, 3], { itemFailures: 'collect' }));
    expect(report.status).toBe('succeeded');
    const each = report.steps.find((s) => s.stepId === 'each')!;
    expect(each.output).toEqual([
      2,
      {
        itemFailed: true,
        index: 1,
        attempts: 1,
        error: { code: 'unknown', message: 'unlucky' },
      },
      6,
    ]);
  });

  it('over a value that is not an array: the map fails, naming the step and the type', async () => {
    const { report } = await runToEnd(mapPlan({ not: 'a list' }));
    expect(report.status).toBe('failed');
    const each = report.steps.find((s) => s.stepId === 'each')!;
    expect(each.error?.code).toBe('map_over_invalid');
    expect(each.error?.message).toContain('map step "each"');
    expect(each.error?.message).toContain('"list.items", which holds object, not an array');
    await worker?.close();
    const other = await runToEnd(mapPlan('text'));
    const step = other.report.steps.find((s) => s.stepId === 'each')!;
    expect(step.error?.message).toContain('holds string, not an array');
  });

  it('an empty list: the output is []', async () => {
    const { report } = await runToEnd(mapPlan([]));
    expect(report.status).toBe('succeeded');
    expect(report.steps.find((s) => s.stepId === 'each')!.output).toEqual([]);
  });

  it('the map shows its progress in status', async () => {
    const { runId } = await runToEnd(mapPlan([1, 2, 3]));
    const status = await runtime.status(runId);
    expect(status.maps).toEqual({ each: { total: 3, done: 3, failed: 0, running: 0 } });
  });

  it('over a step that is not an ancestor is refused, and nothing is written', async () => {
    const plan: PlanInput = {
      name: 'bad',
      steps: [
        { id: 'list', kind: 'operator', operator: 'list' },
        { id: 'other', kind: 'operator', operator: 'list' },
        {
          id: 'each',
          kind: 'map',
          over: 'other.items',
          item: { kind: 'operator', operator: 'double' },
          dependsOn: ['list'],
        },
      ],
    };
    const error = await runtime.start(plan, {}).then(
      () => null,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(PlanValidationError);
    const issues = (error as PlanValidationError).issues;
    expect(issues.map((i) => i.path)).toEqual(['steps[2].over']);
    expect(issues[0]!.message).toContain('add "other" to dependsOn');
    const redis = connect();
    try {
      expect(await scanKeys(redis, `${prefix}*`)).toEqual([]);
    } finally {
      redis.disconnect();
    }
  });

  it('flujo validate refuses a map over a step that is not an ancestor: exit 2, steps[i].over', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'flujo-map-'));
    try {
      const file = join(dir, 'plan.json');
      writeFileSync(
        file,
        JSON.stringify({
          name: 'bad',
          steps: [
            { id: 'list', kind: 'operator', operator: 't' },
            { id: 'other', kind: 'operator', operator: 't' },
            {
              id: 'each',
              kind: 'map',
              over: 'other',
              item: { kind: 'operator', operator: 't' },
              dependsOn: ['list'],
            },
          ],
        }),
      );
      const r = await runFlujo(['validate', file], { prefix });
      expect(r.code).toBe(2);
      expect(r.err).toContain('steps[2].over: over names step "other"');
      expect(r.err).toContain('add "other" to dependsOn');
      expect(r.out).toBe('');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});

describe('map steps of agents', () => {
  let model: ScriptedModelServer;
  beforeEach(async () => {
    model = await startScriptedModelServer();
  });
  afterEach(async () => {
    await model.close();
  });

  it('an agent per element, each with its own tool call key; the answers in order', async () => {
    const saved: { text: string; key: string }[] = [];
    const save = defineTool({
      name: 'save_note',
      input: z.object({ text: z.string() }),
      requiresIdempotencyKey: true,
      run: ({ text }, ctx) => {
        saved.push({ text, key: ctx.idempotencyKey });
        return { saved: text };
      },
    });
    runtime.agent(
      defineAgent({
        name: 'summarizer',
        model: 'gpt-test',
        provider: { baseURL: model.url, apiKey: 'test-key' },
        systemPrompt: 'Save a note about the document, then summarize it.',
        tools: [save],
        timeoutMs: 2000,
      }),
    );
    // Each conversation: a save_note call about its document, then the summary.
    model.setDefaultReply((request) => {
      const messages = request.messages as { role: string; content: string | null }[];
      const doc = String(messages.find((m) => m.role === 'user')?.content ?? '');
      const last = messages[messages.length - 1]!;
      return last.role === 'tool'
        ? { text: `summary of ${doc}` }
        : { toolCalls: [{ name: 'save_note', arguments: { text: doc } }] };
    });
    const plan: PlanInput = {
      name: 'agent-map',
      steps: [
        { id: 'list', kind: 'operator', operator: 'list', input: ['alpha', 'beta', 'gamma'] },
        {
          id: 'each',
          kind: 'map',
          over: 'list.items',
          item: { kind: 'agent', agent: 'summarizer' },
          maxConcurrency: 2,
          dependsOn: ['list'],
        },
      ],
    };
    const { runId, report } = await runToEnd(plan);
    expect(report.steps.map((s) => [s.stepId, s.status, s.error?.message ?? null])).toEqual([
      ['list', 'SUCCEEDED', null],
      ['each', 'SUCCEEDED', null],
    ]);
    const output = report.steps.find((s) => s.stepId === 'each')!.output as { answer: string }[];
    expect(output.map((o) => o.answer)).toEqual([
      'summary of alpha',
      'summary of beta',
      'summary of gamma',
    ]);
    expect(saved.map((s) => s.text).sort()).toEqual(['alpha', 'beta', 'gamma']);
    expect(new Set(saved.map((s) => s.key)).size).toBe(3);
    expect(model.requestCount).toBe(6);
    // One ledger entry per item: each in its own scope.
    expect(await runtime.ledger(runId)).toHaveLength(3);
  });
});
