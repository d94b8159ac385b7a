/**
 * A start whose run was created but whose first work could not be queued: the same call tries the
 * queue again, and when the queue stays out of reach, starting the run again (same run id or same
 * request key) queues its work instead of refusing it. Every run ends driven, each unit once.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisUnavailableError, RunAlreadyExistsError } from '../../src/errors.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, runtimeCore, type Runtime } from '../../src/runtime.js';
import type { RuntimeQueues } from '../../src/actors/runtime-queues.js';
import { caught } from '../helpers/caught.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const plan: PlanInput = {
  name: 'two',
  steps: [
    { id: 'a', kind: 'operator', operator: 'count' },
    { id: 'b', kind: 'operator', operator: 'count', dependsOn: ['a'] },
  ],
};

const prefix = testPrefix();
let runtime: Runtime;
let queues: RuntimeQueues;
const calls = new Map<string, number>();

/** Makes the queue's enqueue of due work fail `times` times (Infinity: until restored). */
function failEnqueue(times: number): () => void {
  const original = queues.enqueueDue.bind(queues);
  let left = times;
  queues.enqueueDue = async (...args) => {
    if (left-- > 0) throw new Error('Connection is closed.');
    return original(...args);
  };
  return () => {
    queues.enqueueDue = original;
  };
}

/** The jobs waiting in the queue for run `runId`. */
async function waitingFor(runId: string): Promise<number> {
  const jobs = await queues.queue.getJobs(['waiting', 'delayed', 'prioritized']);
  return jobs.filter((j) => (j.data as { runId?: string }).runId === runId).length;
}

beforeAll(() => {
  runtime = createRuntime({ redis: redisUrl(), prefix }).operator('count', ({ runId, stepId }) => {
    const key = `${runId}/${stepId}`;
    calls.set(key, (calls.get(key) ?? 0) + 1);
    return null;
  });
  queues = runtimeCore(runtime).queues;
});
afterAll(async () => {
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('a start whose enqueue fails', () => {
  it('is finished by the same call when the queue answers again', async () => {
    const restore = failEnqueue(2);
    try {
      const handle = await runtime.start(plan, null, { runId: 'once' });
      expect(handle.created).toBe(true);
    } finally {
      restore();
    }
    expect(await waitingFor('once')).toBe(1);
  });

  it('says the run exists; a start again with the same run id queues it, not refuses it', async () => {
    const restore = failEnqueue(Infinity);
    let error: unknown;
    try {
      error = await caught(runtime.start(plan, null, { runId: 'again' }));
    } finally {
      restore();
    }
    expect(error).toBeInstanceOf(RedisUnavailableError);
    expect((error as Error).message).toContain('Run "again" was created');
    expect((error as Error).message).toContain('start it again with the same run id');
    expect((await (await runtime.attach('again')).status()).status).toBe('running');
    expect(await waitingFor('again')).toBe(0);

    const handle = await runtime.start(plan, null, { runId: 'again' });
    expect(handle.created).toBe(false);
    expect(await waitingFor('again')).toBe(1);
    // Again: the job's id makes it a no-op.
    await runtime.start(plan, null, { runId: 'again' });
    expect(await waitingFor('again')).toBe(1);
    // Another start that names the run id is still refused.
    const other = await caught(runtime.start(plan, { n: 1 }, { runId: 'again' }));
    expect(other).toBeInstanceOf(RunAlreadyExistsError);
  });

  it('a start again with the same request key queues it', async () => {
    const restore = failEnqueue(Infinity);
    let error: unknown;
    try {
      error = await caught(runtime.start(plan, null, { requestKey: 'k' }));
    } finally {
      restore();
    }
    expect(error).toBeInstanceOf(RedisUnavailableError);
    expect((error as Error).message).toContain('same run id or request key');
    const handle = await runtime.start(plan, null, { requestKey: 'k' });
    expect(handle.created).toBe(false);
    expect(await waitingFor(handle.runId)).toBe(1);

    const worker = runtime.createWorker({ recoverOnStart: false });
    try {
      for (const runId of ['once', 'again', handle.runId]) {
        const report = await (await runtime.attach(runId)).settled({ timeoutMs: 10_000 });
        expect(report.status).toBe('succeeded');
        expect([calls.get(`${runId}/a`), calls.get(`${runId}/b`)]).toEqual([1, 1]);
      }
    } finally {
      await worker.close();
    }
  });
});
