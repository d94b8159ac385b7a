/**
 * `worker.status()`: the units a worker is running while a slow operator runs, and what its units
 * came to (done, failed, busy) once they end.
 */
import { randomUUID } from 'node:crypto';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createRuntime, type FlujoWorker, type PlanInput, type Runtime } from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { deleteRuntimeKeys, redisUrl } from '../helpers/redis.js';

describe('worker.status()', () => {
  let prefix: string;
  let runtime: Runtime;
  let worker: FlujoWorker;
  let release: () => void;
  let slowStarted: Promise<void>;

  beforeEach(async () => {
    prefix = `t-${randomUUID().slice(0, 8)}`;
    let started!: () => void;
    slowStarted = new Promise((resolve) => (started = resolve));
    const gate = new Promise<void>((resolve) => (release = resolve));
    runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger })
      .operator('slow', async () => {
        started();
        await gate;
        return { slow: true };
      })
      .operator('broken', () => {
        throw Object.assign(new Error('broken on purpose'), { retryable: false });
      });
    worker = runtime.createWorker({ concurrency: 3, recoverOnStart: false });
    await worker.ready();
  });
  afterEach(async () => {
    release();
    await worker.close();
    await runtime.close();
    await deleteRuntimeKeys(prefix);
  });

  it('shows the unit a slow operator runs, then the counters once it ended', async () => {
    const before = worker.status();
    expect(before.worker.pid).toBe(process.pid);
    expect(before.worker.id).toMatch(/^[0-9a-f]{8}$/);
    expect(before.concurrency).toBe(3);
    expect(before.running).toEqual([]);
    expect(before.counters).toEqual({ done: 0, failed: 0, busy: 0 });
    expect(before.closing).toBe(false);

    const plan: PlanInput = {
      name: 'slow',
      steps: [{ id: 's', kind: 'operator', operator: 'slow' }],
    };
    const t0 = Date.now();
    const run = await runtime.start(plan, null);
    await slowStarted;
    const during = worker.status();
    expect(during.running).toHaveLength(1);
    const [unit] = during.running;
    expect(unit).toMatchObject({
      runId: run.runId,
      stepId: 's',
      attempt: 1,
      turn: null,
      kind: 'step',
    });
    expect(unit!.since).toBeGreaterThanOrEqual(t0 - 1000);
    expect(unit!.since).toBeLessThanOrEqual(Date.now());
    expect(typeof unit!.jobId).toBe('string');
    expect(during.counters).toEqual({ done: 0, failed: 0, busy: 0 });
    // A snapshot: it does not change under the caller.
    release();
    const report = await run.settled({ timeoutMs: 10_000 });
    expect(report.status).toBe('succeeded');
    expect(during.running).toHaveLength(1);
    // The job's return comes after the commit the run settled on.
    await expect.poll(() => worker.status().counters.done, { timeout: 5000 }).toBe(1);
    const after = worker.status();
    expect(after.running).toEqual([]);
    expect(after.counters).toEqual({ done: 1, failed: 0, busy: 0 });

    const failing: PlanInput = {
      name: 'broken',
      steps: [{ id: 'b', kind: 'operator', operator: 'broken' }],
    };
    const failed = await runtime.start(failing, null);
    expect((await failed.settled({ timeoutMs: 10_000 })).status).toBe('failed');
    await expect.poll(() => worker.status().counters.done, { timeout: 5000 }).toBe(2);
    expect(worker.status().counters).toEqual({ done: 2, failed: 1, busy: 0 });
    expect(worker.status().running).toEqual([]);
  });

  it('says closing once close() was called', async () => {
    const closed = worker.close();
    expect(worker.status().closing).toBe(true);
    await closed;
  });
});
