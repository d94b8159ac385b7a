/**
 * Workers sweep the active runs periodically, not only when they start: a run left with due work
 * and no job (its job removed by hand, or a start that could not queue it) is driven again within
 * the sweep interval, each unit once.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InputValidationError } from '../../src/errors.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, runtimeCore, type Runtime } from '../../src/runtime.js';
import type { RuntimeQueues } from '../../src/actors/runtime-queues.js';
import { caught } from '../helpers/caught.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const plan: PlanInput = {
  name: 'three',
  steps: [
    { id: 'a', kind: 'operator', operator: 'count' },
    { id: 'b', kind: 'operator', operator: 'count', dependsOn: ['a'] },
    { id: 'c', kind: 'operator', operator: 'count', dependsOn: ['a'] },
  ],
};

const prefix = testPrefix();
let runtime: Runtime;
let queues: RuntimeQueues;
const calls = new Map<string, number>();

/** The jobs in the queue for run `runId`, in any state. */
async function jobsOf(runId: string) {
  const jobs = await queues.queue.getJobs(['waiting', 'delayed', 'prioritized', 'active']);
  return jobs.filter((j) => (j.data as { runId?: string }).runId === runId);
}

/** Each step of run `runId` ran once. */
function ranOnce(runId: string): void {
  expect(['a', 'b', 'c'].map((s) => calls.get(`${runId}/${s}`))).toEqual([1, 1, 1]);
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

describe('the periodic sweep', () => {
  it('refuses a sweep interval that is not 0 or a whole number of ms of at least 100', () => {
    for (const bad of [-1, 50, 1.5, Number.NaN, '1000']) {
      const error = (() => {
        try {
          runtime.createWorker({ sweepEveryMs: bad as number, recoverOnStart: false });
        } catch (e) {
          return e;
        }
        return undefined;
      })();
      expect(error).toBeInstanceOf(InputValidationError);
      expect((error as InputValidationError).issues[0]!.path).toBe('sweepEveryMs');
    }
  });

  it('drives a run whose job was removed by hand, each step once', async () => {
    const handle = await runtime.start(plan, null, { runId: 'lost-job' });
    const jobs = await jobsOf('lost-job');
    expect(jobs).toHaveLength(1);
    await jobs[0]!.remove();
    // No start-up recovery: only the periodic sweep can find the run.
    const worker = runtime.createWorker({ recoverOnStart: false, sweepEveryMs: 300 });
    try {
      await worker.ready();
      const report = await handle.settled({ timeoutMs: 5000 });
      expect(report.status).toBe('succeeded');
      ranOnce('lost-job');
    } finally {
      await worker.close();
    }
  });

  it('drives a run that a running worker never got a job for', async () => {
    const worker = runtime.createWorker({ sweepEveryMs: 300 });
    try {
      await worker.ready();
      // The start creates the run but cannot queue it, after the worker's start-up recovery.
      const original = queues.enqueueDue.bind(queues);
      queues.enqueueDue = () => Promise.reject(new Error('Connection is closed.'));
      const error = await caught(runtime.start(plan, null, { runId: 'never-queued' }));
      queues.enqueueDue = original;
      expect((error as Error).message).toContain("any worker's sweep");
      const report = await (await runtime.attach('never-queued')).settled({ timeoutMs: 5000 });
      expect(report.status).toBe('succeeded');
      ranOnce('never-queued');
      // Sweeps after the run ended add nothing.
      await new Promise((r) => setTimeout(r, 700));
      expect(await jobsOf('never-queued')).toHaveLength(0);
      ranOnce('never-queued');
    } finally {
      await worker.close();
    }
  });
});
