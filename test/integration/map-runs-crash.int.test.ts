/**
 * Map steps over child runs with `flujo worker` processes (the job module
 * test/fixtures/jobs/map-runs.ts): a worker SIGKILLed right after an item started its child, or
 * right after a child ended (before the item's wake is added), is replaced; each item's child is
 * created once and the map's output is in element order.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createRuntime, jobQueueName, type PlanInput, type Runtime } from '../../src/index.js';
import { silentLogger } from '../../src/logging.js';
import { plan as modulePlan, plans as modulePlans } from '../fixtures/jobs/map-runs.js';
import { startFlujo, type RunningChild } from '../helpers/cli.js';
import { connect, deleteRuntimeKeys, redisUrl, scanKeys, testPrefix } from '../helpers/redis.js';

const MODULE = 'test/fixtures/jobs/map-runs.ts';
const QUEUE = jobQueueName('mapruns');

let prefix: string;
let dir: string;
let effectFile: string;
let rt: Runtime;
const workers = new Set<RunningChild>();

/** `flujo worker` of the module; with `killAt`, it dies there (not awaited to listen then). */
async function worker(killAt = ''): Promise<RunningChild> {
  const child = startFlujo(['worker', MODULE], {
    prefix,
    env: { EFFECT_FILE: effectFile, FLUJO_KILL_AT: killAt },
  });
  workers.add(child);
  if (killAt === '') {
    await expect
      .poll(() => child.out() + child.err(), { timeout: 30_000 })
      .toContain('flujo worker: processing runs');
  }
  return child;
}

/** The run ids the prefix holds a snapshot of. */
async function runIds(): Promise<string[]> {
  const redis = connect();
  try {
    const keys = await scanKeys(redis, `${prefix}:*:snap`);
    return keys.map((k) => k.slice(k.indexOf('{') + 1, k.lastIndexOf('}'))).sort();
  } finally {
    await redis.quit();
  }
}

beforeEach(() => {
  prefix = testPrefix();
  dir = mkdtempSync(join(tmpdir(), 'flujo-map-runs-'));
  effectFile = join(dir, 'effects.log');
  rt = createRuntime({
    redis: redisUrl(),
    prefix,
    queueName: QUEUE,
    plans: modulePlans as Record<string, PlanInput>,
    logger: silentLogger,
  });
});
afterEach(async () => {
  for (const c of workers) c.child.kill('SIGKILL');
  await Promise.all([...workers].map((c) => c.done.catch(() => null)));
  workers.clear();
  await rt.close();
  await deleteRuntimeKeys(prefix);
  rmSync(dir, { recursive: true, force: true });
});

describe('map steps over child runs, crashes', { timeout: 120_000 }, () => {
  for (const killAt of ['after-child-start:each', 'after-child-end']) {
    it(`a worker killed at ${killAt}: each item's child once, the output in order`, async () => {
      const victim = await worker(killAt);
      const run = await rt.start(modulePlan as PlanInput, null);
      const exit = await victim.done;
      expect(exit.signal, exit.err).toBe('SIGKILL');
      await worker();
      const report = await run.settled({ timeoutMs: 60_000 });
      expect(report.status).toBe('succeeded');
      const each = report.steps.find((s) => s.stepId === 'each')!;
      expect(each.output).toEqual([1, 2, 3, 4, 5].map((n) => ({ sq: n * n })));
      const children = [0, 1, 2, 3, 4].map((i) => `${run.runId}:each.${i}:1.1`);
      expect(await runIds()).toEqual([run.runId, ...children].sort());
      // Each child's operator ran at least once; at most once more in the worker that died.
      const lines = existsSync(effectFile) ? readFileSync(effectFile, 'utf8').split('\n') : [];
      for (const c of children) {
        const ran = lines.filter((l) => l.startsWith(`${c} square `));
        expect(ran.length, c).toBeGreaterThanOrEqual(1);
        const others = ran.filter((l) => !l.endsWith(` ${victim.child.pid}`));
        expect(others.length, c).toBeLessThanOrEqual(1);
      }
    });
  }
});
