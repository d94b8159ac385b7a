/**
 * Conditional steps across a crash: a worker process (test/fixtures/driver-child.ts) is SIGKILLed
 * after the triage step's commit (before the conditional steps are evaluated), or after a false
 * condition was decided and before its skip was committed; another worker finishes the run. The
 * branch not taken never runs, the chosen one runs once, and the join once, with null for the
 * branch not taken.
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import { expectIntact } from '../helpers/integrity.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';
import { spawnWorkerChild, type WorkerChild } from '../helpers/worker-child.js';

const QUEUE = 'cond';

let redis: Redis;
let prefix: string;
let dir: string;
let effectFile: string;
let rt: Runtime;
const children = new Set<WorkerChild>();

function spawnWorker(killAt = '', noWait = false): Promise<WorkerChild> {
  const env = {
    REDIS_URL: redisUrl(),
    FLUJO_PREFIX: prefix,
    QUEUE_NAME: QUEUE,
    EFFECT_FILE: effectFile,
    RECOVERY_MS: '1000',
    FLUJO_KILL_AT: killAt,
  };
  return spawnWorkerChild(env, children, { noWait });
}

/** The steps the children executed, `stepId` per line of the effect file, in order. */
function executed(): string[] {
  if (!existsSync(effectFile)) return [];
  return readFileSync(effectFile, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.split(' ')[1]!);
}

/** What `echo` (the join) saw, per execution. */
function joins(): unknown[] {
  const file = `${effectFile}.echo`;
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l.split(' ').slice(4).join(' ')) as unknown);
}

// `count` with no dependencies gives { count: 1 }: branch a is taken, branch b is not.
const plan: PlanInput = {
  name: 'triage-crash',
  steps: [
    { id: 'triage', kind: 'operator', operator: 'count' },
    {
      id: 'branchA1',
      kind: 'operator',
      operator: 'noop',
      dependsOn: ['triage'],
      when: { step: 'triage', path: 'count', equals: 1 },
    },
    { id: 'branchA2', kind: 'operator', operator: 'noop', dependsOn: ['branchA1'] },
    {
      id: 'branchB1',
      kind: 'operator',
      operator: 'noop',
      dependsOn: ['triage'],
      when: { step: 'triage', path: 'count', equals: 2 },
    },
    { id: 'branchB2', kind: 'operator', operator: 'noop', dependsOn: ['branchB1'] },
    { id: 'join', kind: 'operator', operator: 'echo', dependsOn: ['branchA2', 'branchB2'] },
  ],
};

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  await redis.quit();
});
beforeEach(async () => {
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-cond-'));
  effectFile = join(dir, 'effects.log');
  rt = createRuntime({ redis: redisUrl(), prefix, queueName: QUEUE });
});
afterEach(async () => {
  await Promise.all([...children].map((c) => c.kill()));
  await rt.close();
  await deletePrefix(redis, prefix);
  await rm(dir, { recursive: true, force: true });
});

describe('conditional steps across a crash', () => {
  for (const killAt of ['after-commit:triage', 'before-commit:branchB1']) {
    it(`a worker killed at ${killAt}: the branch not taken never runs`, async () => {
      const victim = await spawnWorker(killAt, true);
      const run = await rt.start(plan, null);
      const exit = await victim.exited;
      expect(exit.signal).toBe('SIGKILL');
      await spawnWorker();
      const report = await run.settled({ timeoutMs: 20_000 });
      expect(report.status).toBe('succeeded');
      const steps = Object.fromEntries(
        report.steps.map((s) => [
          s.stepId,
          `${s.status}${s.reason === null ? '' : `:${s.reason}`}`,
        ]),
      );
      expect(steps).toEqual({
        triage: 'SUCCEEDED',
        branchA1: 'SUCCEEDED',
        branchA2: 'SUCCEEDED',
        branchB1: 'SKIPPED:condition_false',
        branchB2: 'SKIPPED:condition_false',
        join: 'SUCCEEDED',
      });
      const ran = executed();
      expect(ran).not.toContain('branchB1');
      expect(ran).not.toContain('branchB2');
      expect(ran.filter((s) => s === 'join')).toHaveLength(1);
      expect(ran.filter((s) => s === 'triage')).toHaveLength(1);
      expect(joins()).toEqual([{ branchA2: { step: 'branchA2' }, branchB2: null }]);
      await expectIntact(rt, run.runId);
    }, 40_000);
  }
});
