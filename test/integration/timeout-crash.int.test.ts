/**
 * A step with a `timeoutMs` whose worker is killed (SIGKILL) while the timeout is pending: the
 * attempt is picked up by another worker process, its tool effect happens once, and the timeout
 * still bounds the attempt there. Worker children: test/fixtures/timeout-child.ts.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime, runtimeCore } from '../../src/runtime.js';
import { effectLines } from '../fixtures/crash-tools.js';
import { expectIntact } from '../helpers/integrity.js';
import { killChildren, spawnReadyChild } from '../helpers/ready-child.js';
import { connect, deletePrefix, redisUrl, testPrefix } from '../helpers/redis.js';

const QUEUE = 'tmo';

let redis: Redis;
let prefix: string;
let dir: string;
let rt: Runtime;
const children = new Set<ChildProcess>();

/** Spawns a worker child and waits for its `ready` line; `exited` resolves when it is gone. */
const spawnWorker = (env: Record<string, string>) =>
  spawnReadyChild(
    'timeout-child.ts',
    {
      REDIS_URL: redisUrl(),
      FLUJO_PREFIX: prefix,
      QUEUE_NAME: QUEUE,
      EFFECT_FILE: join(dir, 'effects.log'),
      EXEC_FILE: join(dir, 'executions.log'),
      FLUJO_KILL_AT: '',
      ...env,
    },
    children,
  );

/** The executions the children recorded: `[attempt, pid]`. */
function executions(): [number, number][] {
  const file = join(dir, 'executions.log');
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => {
      const [, , attempt, pid] = l.split(' ');
      return [Number(attempt), Number(pid)];
    });
}

const plan = (timeoutMs: number): PlanInput => ({
  name: 'timeout-crash',
  steps: [
    {
      id: 'pay',
      kind: 'operator',
      operator: 'pay',
      effects: ['external'],
      timeoutMs,
      retry: { maxAttempts: 2, initialDelayMs: 20, jitter: 0 },
    },
  ],
});

async function failuresOf(runId: string): Promise<{ attempt: unknown; code: unknown }[]> {
  const events = await runtimeCore(rt).stores.store.readEvents(runId);
  return events
    .filter((e) => e.type === 'step.failed')
    .map((e) => ({ attempt: e.data['attempt'], code: (e.data['error'] as { code: string }).code }));
}

beforeAll(() => {
  redis = connect();
});
afterAll(async () => {
  await redis.quit();
});
beforeEach(async () => {
  prefix = testPrefix();
  dir = await mkdtemp(join(tmpdir(), 'flujo-timeout-'));
  rt = createRuntime({ redis: redisUrl(), prefix, queueName: QUEUE });
});
afterEach(async () => {
  killChildren(children);
  children.clear();
  await rt.close();
  await deletePrefix(redis, prefix);
  await rm(dir, { recursive: true, force: true });
});

describe('a step killed while its timeout is pending', () => {
  it('killed after the receipt: the attempt resumes on another worker, the effect happens once, and the timeout still bounds the attempt there', async () => {
    const first = await spawnWorker({ FLUJO_KILL_AT: 'after-receipt' });
    const run = await rt.start(plan(2500));
    expect(await first.exited).toMatchObject({ signal: 'SIGKILL' });
    expect(effectLines(join(dir, 'effects.log'))).toHaveLength(1);

    // The second worker sleeps past the timeout on attempt 1, so only timeoutMs ends it there.
    await spawnWorker({ SLOW_ATTEMPTS: '1', SLOW_MS: '30000' });
    const done = await run.settled({ timeoutMs: 30_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced['pay']).toEqual({
      receipt: { appended: 'paid', deduped: false },
      attempt: 2,
    });
    expect(effectLines(join(dir, 'effects.log'))).toHaveLength(1);
    const execs = executions();
    expect(execs.map(([attempt]) => attempt)).toEqual([1, 1, 2]);
    expect(execs[0]![1]).not.toBe(execs[1]![1]);
    expect(await failuresOf(run.runId)).toEqual([{ attempt: 1, code: 'timeout' }]);
    const ledger = await rt.ledger(run.runId);
    expect(ledger).toHaveLength(1);
    expect(ledger[0]).toMatchObject({ state: 'SUCCEEDED', runs: 1 });
    await expectIntact(rt, run.runId);
  });

  it('killed mid-tool (effect done, no receipt): a keyed tool re-runs with the same key and the effect stays single', async () => {
    const first = await spawnWorker({ FLUJO_KILL_AT: 'after-tool-effect', TOOL_MODE: 'keyed' });
    const run = await rt.start(plan(10_000));
    expect(await first.exited).toMatchObject({ signal: 'SIGKILL' });
    expect(effectLines(join(dir, 'effects.log'))).toHaveLength(1);
    // The dead worker's tool lease (1 s) must lapse before the next worker reaches the call: a
    // worker that met the live lease would hand the step back (no attempt spent) and run the
    // operator once more before the call, which this test does not count on.
    const [held] = await rt.ledger(run.runId);
    expect(held).toMatchObject({ state: 'RUNNING', runs: 1 });
    await sleep(Math.max(0, held!.leaseUntil! - Date.now()) + 50);

    await spawnWorker({ TOOL_MODE: 'keyed' });
    const done = await run.settled({ timeoutMs: 30_000 });
    expect(done.status).toBe('succeeded');
    expect(done.summary.produced['pay']).toEqual({
      receipt: { appended: 'paid', deduped: true },
      attempt: 1,
    });
    expect(effectLines(join(dir, 'effects.log'))).toHaveLength(1);
    expect(executions().map(([attempt]) => attempt)).toEqual([1, 1]);
    expect(await failuresOf(run.runId)).toEqual([]);
    expect((await rt.ledger(run.runId))[0]).toMatchObject({ state: 'SUCCEEDED', runs: 2 });
    await expectIntact(rt, run.runId);
  });
});

describe('onStepFailure across a crash', () => {
  it('is called by the worker that committed the failure, and not again by the one that finds it committed', async () => {
    const hookFile = join(dir, 'hook.log');
    // Killed right after the commit of attempt 1's failure (and its hook call).
    const first = await spawnWorker({
      FLUJO_KILL_AT: 'after-commit@1',
      FAIL_ATTEMPTS: '1',
      HOOK_FILE: hookFile,
    });
    const run = await rt.start(plan(10_000));
    expect(await first.exited).toMatchObject({ signal: 'SIGKILL' });
    await spawnWorker({ FAIL_ATTEMPTS: '1', HOOK_FILE: hookFile });
    const done = await run.settled({ timeoutMs: 30_000 });
    expect(done.status).toBe('succeeded');
    expect(done.steps[0]).toMatchObject({ attempt: 2 });
    // Attempt 1 ran once (its failure was committed before the kill), attempt 2 once.
    expect(executions().map(([attempt]) => attempt)).toEqual([1, 2]);
    const calls = effectLines(hookFile).map((l) => l.split(' '));
    expect(calls).toHaveLength(1);
    expect(calls[0]!.slice(0, 4)).toEqual(['pay', '1', 'unknown', 'true']);
    expect(Number(calls[0]![4])).toBe(executions()[0]![1]);
    expect(effectLines(join(dir, 'effects.log'))).toHaveLength(1);
    await expectIntact(rt, run.runId);
  });
});
