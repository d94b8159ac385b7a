/**
 * What a process keeps of the runs it started: a caller with no worker of its own starts more runs
 * than it keeps metas for, and holds no more than that many (not one per run it ever started);
 * a run whose meta it let go is read back whole, and a worker on another runtime runs it.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { createRuntime, type PlanInput, type Runtime } from '../../src/index.js';
import { runtimeCore } from '../../src/runtime.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const plan: PlanInput = {
  name: 'kept',
  steps: [{ id: 'echo', kind: 'operator', operator: 'echo' }],
};

const prefix = testPrefix();
const opened: Runtime[] = [];

afterAll(async () => {
  for (const runtime of opened) await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('the metas a process keeps', { timeout: 120_000 }, () => {
  it('a caller that starts 1,100 runs keeps at most 1,024 metas, and a run let go reads back whole', async () => {
    const caller = createRuntime({ redis: redisUrl(), prefix });
    opened.push(caller);
    const ids: string[] = [];
    for (let i = 0; i < 1100; i++) ids.push((await caller.start(plan, { n: i })).runId);
    const { meta } = runtimeCore(caller);
    expect(meta.kept).toBe(1024);
    // The first run's meta was let go first: read back from Redis, as it was started.
    const first = await meta.read(ids[0]!);
    expect(first.input).toEqual({ n: 0 });
    expect(first.plan.name).toBe('kept');
    expect(meta.kept).toBe(1024);
    // A worker of another runtime runs them all, each with its own input.
    const seen: unknown[] = [];
    const runner = createRuntime({ redis: redisUrl(), prefix }).operator('echo', ({ input }) => {
      seen.push(input);
      return input;
    });
    opened.push(runner);
    const worker = runner.createWorker({ concurrency: 8 });
    await worker.ready();
    for (const runId of [ids[0]!, ids.at(-1)!]) {
      const report = await (await runner.attach(runId)).settled({ timeoutMs: 100_000 });
      expect(report.status).toBe('succeeded');
    }
    await expect.poll(() => seen.length, { timeout: 100_000 }).toBe(1100);
    await worker.close();
    const inputs = (seen as { n: number }[]).map((x) => x.n).sort((a, b) => a - b);
    expect(inputs).toEqual(Array.from({ length: 1100 }, (_, i) => i));
  });
});
