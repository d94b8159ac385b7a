/**
 * A wide fan-out driven by two `flujo worker` processes: 1 + 998 + 1 steps (the most a plan may
 * have), started from this process. Each step's operator runs exactly once, counted at the
 * operator (not from commits). Units of one run that finish together
 * used to race each other's compare-and-set; the losers reloaded the whole run, a worker's event
 * loop stalled past its job locks, and the other worker took those units over and ran them again.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, type Runtime } from '../../src/index.js';
import { startFlujo, type RunningChild } from '../helpers/cli.js';
import { deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const LEAVES = 998;
// The plan of JOB with LEAVES leaves, started here (the workers have its operator).
const plan = {
  name: 'wide',
  steps: [
    { id: 'root', kind: 'operator' as const, operator: 'work' },
    ...Array.from({ length: LEAVES }, (_, i) => ({
      id: `l${i}`,
      kind: 'operator' as const,
      operator: 'work',
      dependsOn: ['root'],
    })),
    {
      id: 'join',
      kind: 'operator' as const,
      operator: 'work',
      dependsOn: Array.from({ length: LEAVES }, (_, i) => `l${i}`),
    },
  ],
};
const JOB = 'test/fixtures/jobs/wide.ts';
const prefix = testPrefix();
let scratch: string;
let runtime: Runtime;

beforeAll(() => {
  scratch = mkdtempSync(join(tmpdir(), 'flujo-wide-'));
  runtime = createRuntime({ redis: redisUrl(), prefix });
});
afterAll(async () => {
  await runtime.close();
  await deleteRuntimeKeys(prefix);
  rmSync(scratch, { recursive: true, force: true });
});

describe('a fan-out of 998 leaves on two worker processes', () => {
  it('runs each step once', { timeout: 240_000 }, async () => {
    const countFile = join(scratch, 'count');
    const env = { COUNT_FILE: countFile, LEAVES: String(LEAVES) };
    const workers: RunningChild[] = [1, 2].map(() =>
      startFlujo(['worker', JOB, '--concurrency', '8'], { prefix, env }),
    );
    try {
      const handle = await runtime.start(plan, null);
      const report = await handle.settled({ timeoutMs: 200_000 });
      expect(report.status).toBe('succeeded');
    } finally {
      for (const w of workers) w.child.kill('SIGTERM');
    }
    for (const w of workers) expect((await w.done).code).toBe(0);
    const lines = readFileSync(countFile, 'utf8').trim().split('\n');
    const byStep = new Map<string, number>();
    for (const line of lines) {
      const stepId = line.split(' ')[1]!;
      byStep.set(stepId, (byStep.get(stepId) ?? 0) + 1);
    }
    expect(byStep.size).toBe(LEAVES + 2);
    expect([...byStep].filter(([, n]) => n !== 1)).toEqual([]);
    expect(lines).toHaveLength(LEAVES + 2);
  });
});
