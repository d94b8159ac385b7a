/**
 * `flujo worker` stops on SIGTERM without hanging: running units finish first, a second signal
 * stops it at once, and a Redis that is gone does not hold the stop up (no unit could commit).
 * The real binary, on a redis-server of the test's own that the test shuts down.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { createRuntime, type PlanInput } from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { plan as linePlan } from '../fixtures/jobs/line.js';
import { startFlujo } from '../helpers/cli.js';
import { startRedisServer, type TestRedisServer } from '../helpers/redis-server.js';

const LINE = 'test/fixtures/jobs/line.ts';

describe('flujo worker stops', { timeout: 60_000 }, () => {
  let server: TestRedisServer | undefined;
  afterEach(async () => {
    await server?.stop().catch(() => {});
    server = undefined;
  });

  function worker(url: string) {
    const w = startFlujo(['worker', LINE, '--redis', url, '--redis-timeout', '1000'], {
      redis: 'none',
    });
    return { ...w, text: () => w.out() + w.err() };
  }

  it('once Redis is gone: within its timeout after SIGTERM, exit 6, naming Redis', async () => {
    server = await startRedisServer(['--save', '', '--appendonly', 'no']);
    const w = worker(server.url);
    await expect.poll(w.text, { timeout: 20_000 }).toContain('flujo worker: processing runs');
    await server.stop();
    server = undefined;
    await expect.poll(w.text, { timeout: 10_000 }).toContain('does not answer');
    const sent = Date.now();
    w.child.kill('SIGTERM');
    const result = await w.done;
    const tookMs = Date.now() - sent;
    expect(result.code).toBe(6);
    expect(w.text()).toContain('stopped without waiting for the running units');
    // The connection's timeout (1 s) to see Redis is gone, as much again to close: not 30 s.
    expect(tookMs).toBeLessThan(8000);
  });

  it('a running unit holds the first SIGTERM; a second one stops the worker at once', async () => {
    server = await startRedisServer(['--save', '', '--appendonly', 'no']);
    const prefix = 'flujo';
    const w = worker(server.url);
    await expect.poll(w.text, { timeout: 20_000 }).toContain('flujo worker: processing runs');
    const runtime = createRuntime({ redis: server.url, prefix, logger: silentLogger });
    try {
      const run = await runtime.start(linePlan() as PlanInput, { slowMs: 20_000 });
      await expect
        .poll(async () => (await run.status()).steps.find((s) => s.stepId === 'a')?.status, {
          timeout: 10_000,
        })
        .toBe('RUNNING');
      w.child.kill('SIGTERM');
      await expect.poll(w.text, { timeout: 5000 }).toContain('a second Ctrl-C stops at once');
      // Still running: the step sleeps 20 s and the first signal waits for it.
      await new Promise((resolve) => setTimeout(resolve, 1000));
      expect(w.child.exitCode).toBeNull();
      const sent = Date.now();
      w.child.kill('SIGTERM');
      const result = await w.done;
      expect(result.code).toBe(0);
      expect(w.text()).toContain('flujo worker: stopped at once');
      expect(Date.now() - sent).toBeLessThan(5000);
      // Nothing of the step was committed: it runs again on the next worker.
      expect((await run.status()).steps.find((s) => s.stepId === 'a')?.status).toBe('RUNNING');
    } finally {
      await runtime.close();
    }
  });
});
