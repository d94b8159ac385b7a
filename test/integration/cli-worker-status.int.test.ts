/**
 * `flujo worker` shows its status on stderr: JSON lines with `--status-every`, one at once on
 * SIGUSR2; a bad `--status-every` is refused before anything is written. The real binary
 * (bin/flujo.js → dist, rebuilt when src/ changes).
 */
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, type PlanInput } from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import type { WorkerStatus } from '../../src/worker/registry.js';
import { plan as linePlan } from '../fixtures/jobs/line.js';
import { startFlujo } from '../helpers/cli.js';
import { connect, deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const LINE = 'test/fixtures/jobs/line.ts';

type StatusLine = WorkerStatus & { type: string; at: number };

/** `flujo worker` on `prefix`, with the status lines it writes to stderr as they come. */
function startWorker(prefix: string, extra: string[]) {
  const { child, out, err, done } = startFlujo(['worker', LINE, ...extra], { prefix });
  const statuses = (): StatusLine[] =>
    err()
      .split('\n')
      .filter((l) => l.startsWith('{"type":"worker.status"'))
      .map((l) => JSON.parse(l) as StatusLine);
  const exited = done.then((r) => r.code);
  return { child, out, err, statuses, exited };
}

/** Every key of a prefix, with its queue's. */
async function keysOf(redis: Redis, prefix: string): Promise<string[]> {
  const keys: string[] = [];
  for (const pattern of [`${prefix}:*`, `{${prefix}:q}*`, `{${prefix}:runs}*`]) {
    let cursor = '0';
    do {
      const [next, batch] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 500);
      cursor = next;
      keys.push(...batch);
    } while (cursor !== '0');
  }
  return keys;
}

describe('flujo worker status', { timeout: 60_000 }, () => {
  let redis: Redis;
  const prefixes: string[] = [];
  beforeAll(() => {
    redis = connect();
  });
  afterAll(async () => {
    for (const p of prefixes) await deleteRuntimeKeys(p);
    redis.disconnect();
  });

  it('--status-every writes JSON status lines showing the running unit, then the counters; SIGUSR2 writes one at once', async () => {
    const prefix = testPrefix();
    prefixes.push(prefix);
    const worker = startWorker(prefix, ['--concurrency', '2', '--status-every', '100']);
    await expect
      .poll(() => worker.out(), { timeout: 20_000 })
      .toContain('flujo worker: processing runs');
    await expect.poll(() => worker.statuses().length, { timeout: 5000 }).toBeGreaterThan(0);
    const first = worker.statuses()[0]!;
    expect(first.worker.pid).toBe(worker.child.pid);
    expect(first.concurrency).toBe(2);
    expect(first.running).toEqual([]);
    expect(first.counters).toEqual({ done: 0, failed: 0, busy: 0 });

    const runtime = createRuntime({ redis: redisUrl(), prefix, logger: silentLogger });
    try {
      const run = await runtime.start(linePlan() as PlanInput, { slowMs: 400 });
      await expect
        .poll(
          () =>
            worker
              .statuses()
              .some((s) => s.running.some((u) => u.runId === run.runId && u.stepId === 'a')),
          { timeout: 10_000 },
        )
        .toBe(true);
      const during = worker.statuses().find((s) => s.running.length > 0)!;
      expect(during.running[0]).toMatchObject({
        runId: run.runId,
        stepId: 'a',
        attempt: 1,
        turn: null,
        kind: 'step',
      });
      expect((await run.settled({ timeoutMs: 20_000 })).status).toBe('succeeded');
      await expect
        .poll(() => worker.statuses().at(-1)?.counters, { timeout: 5000 })
        .toEqual({ done: 3, failed: 0, busy: 0 });
      expect(worker.statuses().at(-1)!.running).toEqual([]);
    } finally {
      await runtime.close();
    }

    // SIGUSR2: a line at once, beside the periodic ones.
    const before = worker.statuses().length;
    worker.child.kill('SIGUSR2');
    await expect.poll(() => worker.statuses().length, { timeout: 5000 }).toBeGreaterThan(before);

    worker.child.kill('SIGTERM');
    expect(await worker.exited).toBe(0);
    expect(worker.out()).toContain('flujo worker: stopping');
  });

  it('refuses a bad --status-every naming the fix, and writes nothing', async () => {
    const prefix = testPrefix();
    prefixes.push(prefix);
    const worker = startWorker(prefix, ['--status-every', '5']);
    expect(await worker.exited).toBe(2);
    expect(worker.err()).toContain('--status-every "5" is not a whole number of milliseconds');
    expect(worker.err()).toContain('--status-every 5000');
    expect(worker.statuses()).toEqual([]);
    expect(await keysOf(redis, prefix)).toEqual([]);
  });
});
