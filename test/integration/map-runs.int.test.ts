/**
 * Map steps whose items are child runs (`item: { kind: 'run', plan }`), on a real Redis: one child
 * per element and item attempt, the element its input, the map's output the children's results in
 * element order; a child that fails is a failed attempt of its item (a retry starts a new child);
 * a cancelled child fails its item finally, and the parent's failure cancels its other children;
 * an item's plan that is not registered is refused with nothing written.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  createRuntime,
  InputValidationError,
  type FlujoWorker,
  type JsonValue,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { runFlujo } from '../helpers/cli.js';
import { connect, deleteRuntimeKeys, redisUrl, scanKeys } from '../helpers/redis.js';

let runtime: Runtime;
let worker: FlujoWorker | undefined;
let prefix: string;
let invocations: Map<number, number>;

const quiet = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };

const mapPlan = (list: JsonValue, plan = 'child'): PlanInput => ({
  name: 'parent',
  defaults: { retry: { initialDelayMs: 10, maxDelayMs: 50 } },
  steps: [
    { id: 'list', kind: 'operator', operator: 'list', input: list },
    {
      id: 'each',
      kind: 'map',
      over: 'list.items',
      item: { kind: 'run', plan },
      dependsOn: ['list'],
      maxConcurrency: 3,
    },
  ],
});

beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  runtime = createRuntime({ redis: redisUrl(), prefix, logger: quiet });
  invocations = new Map();
  runtime
    .operator('list', ({ input }) => ({ items: input }))
    .operator('square', async ({ input }) => {
      const n = input as number;
      invocations.set(n, (invocations.get(n) ?? 0) + 1);
      await new Promise((r) => setTimeout(r, 5));
      if (n < 0 && invocations.get(n)! < 2) throw new Error(`transient ${n}`);
      return n * n;
    })
    .plan('gated', { name: 'gated', steps: [{ id: 'ask', kind: 'human_gate' }] })
    .plan('child', {
      name: 'child',
      steps: [{ id: 'sq', kind: 'operator', operator: 'square', retry: { maxAttempts: 1 } }],
    });
});
afterEach(async () => {
  await worker?.close();
  worker = undefined;
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

async function runToEnd(plan: PlanInput) {
  worker = runtime.createWorker({ concurrency: 4 });
  await worker.ready();
  const run = await runtime.start(plan, {});
  const report = await run.settled({ timeoutMs: 30_000 });
  return { runId: run.runId, report };
}

describe('map steps over child runs', { timeout: 60_000 }, () => {
  it('starts one child per element, in order, each once', async () => {
    const list = [1, 2, 3, 4, 5];
    const { runId, report } = await runToEnd(mapPlan(list));
    expect(report.status).toBe('succeeded');
    const each = report.steps.find((s) => s.stepId === 'each')!;
    expect(each.output).toEqual(list.map((n) => ({ sq: n * n })));
    for (const n of list) expect(invocations.get(n)).toBe(1);
    const runs = await runtime.list();
    const children = runs.filter((r) => r.runId !== runId).map((r) => r.runId);
    expect(children.sort()).toEqual(list.map((_, i) => `${runId}:each.${i}:1.1`).sort());
    const child = await runtime.status(`${runId}:each.2:1.1`);
    expect(child.status).toBe('succeeded');
    expect(child.parent).toMatchObject({ runId, stepId: 'each.2', attempt: 1, itemAttempt: 1 });
    expect(report.children.map((c) => [c.stepId, c.attempt, c.status])).toEqual(
      list.map((_, i) => [`each.${i}`, 1, 'succeeded']),
    );
  });

  it('a child that fails is a failed attempt of its item: the retry starts a second child', async () => {
    const list = [1, -2, 3];
    const { runId, report } = await runToEnd(mapPlan(list));
    expect(report.status).toBe('succeeded');
    const each = report.steps.find((s) => s.stepId === 'each')!;
    expect(each.output).toEqual(list.map((n) => ({ sq: n * n })));
    expect(invocations.get(-2)).toBe(2);
    expect(invocations.get(1)).toBe(1);
    const runs = (await runtime.list()).map((r) => r.runId).filter((id) => id !== runId);
    expect(runs.sort()).toEqual(
      [
        `${runId}:each.0:1.1`,
        `${runId}:each.1:1.1`,
        `${runId}:each.1:1.2`,
        `${runId}:each.2:1.1`,
      ].sort(),
    );
    expect((await runtime.status(`${runId}:each.1:1.1`)).status).toBe('failed');
    expect((await runtime.status(`${runId}:each.1:1.2`)).status).toBe('succeeded');
  });

  it('a cancelled child fails its item finally; the failed parent cancels the other children', async () => {
    worker = runtime.createWorker({ concurrency: 4 });
    await worker.ready();
    const run = await runtime.start(mapPlan([1, 2], 'gated'), {});
    const [first, second] = [0, 1].map((i) => `${run.runId}:each.${i}:1.1`);
    await expect
      .poll(async () => (await runtime.list()).map((r) => r.runId).sort(), { timeout: 20_000 })
      .toEqual([run.runId, first!, second!].sort());
    await expect
      .poll(async () => (await runtime.status(first!)).status, { timeout: 20_000 })
      .toBe('waiting');
    await runtime.cancel(first!);
    const report = await run.settled({ timeoutMs: 30_000 });
    expect(report.status).toBe('failed');
    const each = report.steps.find((s) => s.stepId === 'each')!;
    expect(each.error?.code).toBe('item_failed');
    expect(each.error?.message).toContain('child_failed');
    await expect
      .poll(async () => (await runtime.status(second!)).status, { timeout: 20_000 })
      .toBe('cancelled');
    // No retry of the cancelled child's item: no second child.
    expect((await runtime.list()).map((r) => r.runId).sort()).toEqual(
      [run.runId, first!, second!].sort(),
    );
  });

  it("an item's plan that is not registered is refused, nothing written", async () => {
    const refused = await runtime.start(mapPlan([1], 'nowhere'), {}).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(InputValidationError);
    const issues = (refused as InputValidationError).issues;
    expect(issues.map((i) => i.path)).toEqual(['steps[1].item.plan']);
    expect(issues[0]!.message).toContain('runtime.plan("nowhere", plan)');
    const validate = await runFlujo(['validate', 'test/fixtures/jobs/map-runs-lost.ts']);
    expect(validate.code).toBe(2);
    expect(validate.err).toContain('steps[1].item.plan names plan "nowhere" (map step "each")');
    const started = await runFlujo(['run', 'test/fixtures/jobs/map-runs-lost.ts'], { prefix });
    expect(started.code).toBe(2);
    const redis = connect();
    try {
      expect(await scanKeys(redis, `${prefix}:*`)).toEqual([]);
    } finally {
      redis.disconnect();
    }
  });
});
