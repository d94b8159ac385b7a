/**
 * Run priority: 50 runs queued without a priority, then 5 with priority 10, one worker at
 * concurrency 1. Each run is two steps, so the second unit of every run is added after the first
 * commits and keeps its run's priority. The high runs finish before every low run that had not
 * started when they were queued. Refused priorities write nothing.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InputValidationError } from '../../src/errors.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, runtimeCore, type Runtime } from '../../src/runtime.js';
import { stepJobId } from '../../src/actors/jobs.js';
import { caught } from '../helpers/caught.js';
import { connect, deleteRuntimeKeys, readPrefix, testPrefix, redisUrl } from '../helpers/redis.js';

const plan: PlanInput = {
  name: 'two-steps',
  steps: [
    { id: 'a', kind: 'operator', operator: 'a' },
    { id: 'b', kind: 'operator', operator: 'b', dependsOn: ['a'] },
  ],
};

const prefix = testPrefix();
let redis: Redis;
let runtime: Runtime;
/** Run tags in the order their first step began. */
const began: string[] = [];
/** Run tags in the order their last step ended. */
const finished: string[] = [];

beforeAll(() => {
  redis = connect();
  runtime = createRuntime({ redis: redisUrl(), prefix })
    .operator('a', async ({ input }) => {
      began.push((input as { tag: string }).tag);
      await sleep(5);
      return 1;
    })
    .operator('b', async ({ input }) => {
      await sleep(5);
      finished.push((input as { tag: string }).tag);
      return 2;
    });
});
afterAll(async () => {
  await runtime.close();
  await deleteRuntimeKeys(prefix);
  redis.disconnect();
});

describe('run priority', { timeout: 60_000 }, () => {
  it('5 runs of priority 10 queued after 50 without one finish before every low run not yet started', async () => {
    const worker = runtime.createWorker({ concurrency: 1 });
    await worker.ready();
    try {
      const low = [];
      for (let i = 0; i < 50; i++) low.push(await runtime.start(plan, { tag: `low-${i}` }));
      const high = [];
      for (let i = 0; i < 5; i++) {
        high.push(await runtime.start(plan, { tag: `high-${i}` }, { priority: 10 }));
      }
      // The low runs already running once the high ones are queued.
      const startedBefore = new Set(began);
      for (const run of [...high, ...low]) {
        expect((await run.settled({ timeoutMs: 30_000 })).status).toBe('succeeded');
      }
      expect(finished).toHaveLength(55);
      const lastHigh = Math.max(...high.map((_, i) => finished.indexOf(`high-${i}`)));
      const lowsBefore = finished.slice(0, lastHigh).filter((t) => t.startsWith('low-'));
      // Only low runs already running then (one more whose job was taken but whose operator had
      // not begun yet, at most: the worker runs one unit at a time).
      expect(lowsBefore.filter((t) => !startedBefore.has(t)).length).toBeLessThanOrEqual(1);
      expect(startedBefore.size).toBeLessThan(50);
      // Stored with the run: every unit job of it is added with its BullMQ priority.
      const meta = await runtimeCore(runtime).meta.read(high[0]!.runId);
      expect(meta.priority).toBe(10);
      expect((await runtimeCore(runtime).meta.read(low[0]!.runId)).priority).toBe(0);
      const job = await runtimeCore(runtime).queues.queue.getJob(stepJobId(high[0]!.runId, 'b', 1));
      // A chained unit has no job of its own; one that has carries the run's priority.
      if (job !== undefined) expect(job.opts.priority).toBe(991);
    } finally {
      await worker.close();
    }
  });

  it('a priority that is not an integer in range is refused, naming the field, and writes nothing', async () => {
    const before = await readPrefix(redis, `${prefix}:`);
    for (const priority of [1.5, '3', 1001, -1001, Number.NaN]) {
      const error = await caught(
        runtime.start(plan, { tag: 'x' }, { priority: priority as number }),
      );
      expect(error).toBeInstanceOf(InputValidationError);
      expect((error as InputValidationError).issues[0]!.path).toBe('priority');
      expect((error as Error).message).toMatch(/priority.*integer from -1000 to 1000/);
    }
    expect(await readPrefix(redis, `${prefix}:`)).toEqual(before);
  });
});
