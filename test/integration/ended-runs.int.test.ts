/**
 * The sweep checks the runs that ended lately against their snapshots. A run's end is noted beside
 * the active runs (another slot than the run's on a cluster); here the run's own keys are put back
 * as they were before its end (DUMP of every key of its hash tag before, RESTORE after), as a
 * failover to a replica that lagged would leave them, while the active runs and the note keep the
 * end. A worker then drives the run to its end again: the steps whose commits were taken back run
 * again, the others do not. A run that stayed ended is not touched; a run past the window is not
 * checked; a run whose keys are all gone is dropped with a warning; an active run that ended
 * leaves the active runs. An active run whose state went back (a unit due again whose job has
 * finished) has its finished jobs replaced by the sweep of the active runs.
 */
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  createRuntime,
  InputValidationError,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import type { Logger } from '../../src/logging.js';
import { createKeys } from '../../src/persistence/keys.js';
import { connect, deleteRuntimeKeys, redisUrl, testPrefix } from '../helpers/redis.js';

const plan: PlanInput = {
  name: 'line',
  steps: [
    { id: 'a', kind: 'operator', operator: 'count' },
    { id: 'b', kind: 'operator', operator: 'count', dependsOn: ['a'] },
    { id: 'c', kind: 'operator', operator: 'count', dependsOn: ['b'] },
  ],
};

const prefix = testPrefix();
const keys = createKeys(prefix);
const calls = new Map<string, number>();
const warnings: { message: string; fields: Record<string, unknown> }[] = [];
const logger: Logger = {
  debug: () => {},
  info: () => {},
  warn: (fields, message) => warnings.push({ message, fields: fields as Record<string, unknown> }),
  error: () => {},
};
/** Steps (`<run>/<step>`) whose first call waits until released; `entered` is called first. */
const holds = new Map<string, { entered: () => void; released: Promise<void> }>();

/** Holds the first call of a step: resolves `inside` when it is called, until `release()`. */
function holdStep(key: string): { inside: Promise<void>; release: () => void } {
  let entered!: () => void;
  let release!: () => void;
  const inside = new Promise<void>((r) => (entered = r));
  holds.set(key, { entered, released: new Promise<void>((r) => (release = r)) });
  return { inside, release };
}

let redis: Redis;
let runtime: Runtime;
const runtimes: Runtime[] = [];

function makeRuntime(options: { endedRunsCheckMs?: number; prefix?: string } = {}): Runtime {
  const rt = createRuntime({
    redis: redisUrl(),
    prefix: options.prefix ?? prefix,
    logger,
    ...(options.endedRunsCheckMs === undefined
      ? {}
      : { endedRunsCheckMs: options.endedRunsCheckMs }),
  }).operator('count', async ({ runId, stepId }) => {
    const key = `${runId}/${stepId}`;
    const n = (calls.get(key) ?? 0) + 1;
    calls.set(key, n);
    const hold = holds.get(key);
    if (hold !== undefined && n === 1) {
      hold.entered();
      await hold.released;
    }
    return { n };
  });
  runtimes.push(rt);
  return rt;
}

/** How often each step of the run was called. */
const counts = (runId: string) => ['a', 'b', 'c'].map((s) => calls.get(`${runId}/${s}`) ?? 0);

/** Every key of the run's hash tag, under `p`. */
async function runKeys(runId: string, p = prefix): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `${p}:{${runId}}:*`, 'COUNT', 500);
    cursor = next;
    found.push(...batch);
  } while (cursor !== '0');
  return found;
}

/** DUMP of every key of the run. */
async function dumpRun(runId: string, p = prefix): Promise<Map<string, Buffer>> {
  const dumped = new Map<string, Buffer>();
  for (const key of await runKeys(runId, p)) {
    const dump = await redis.dumpBuffer(key);
    if (dump !== null) dumped.set(key, dump);
  }
  return dumped;
}

/** The run's keys as dumped, and no other: its state went back. */
async function restoreRun(runId: string, dumped: Map<string, Buffer>, p = prefix): Promise<void> {
  const now = await runKeys(runId, p);
  if (now.length > 0) await redis.del(...now);
  for (const [key, dump] of dumped) await redis.restore(key, 0, dump, 'REPLACE');
}

/** Waits until the run is noted as ended and no longer active. */
async function waitEnded(runId: string, p = keys): Promise<number> {
  const until = Date.now() + 5000;
  for (;;) {
    const [score, active] = await Promise.all([
      redis.zscore(p.endedRuns(), runId),
      redis.sismember(p.activeRuns(), runId),
    ]);
    if (score !== null && active === 0) return Number(score);
    if (Date.now() > until) throw new Error(`run ${runId} was not noted as ended`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Starts `runId` and takes its keys' DUMP while step b is running (a is committed). */
async function runWithSavedState(rt: Runtime, runId: string, p = prefix) {
  const b = holdStep(`${runId}/b`);
  const handle = await rt.start(plan, null, { runId });
  await b.inside;
  const saved = await dumpRun(runId, p);
  b.release();
  expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
  return saved;
}

beforeAll(() => {
  redis = connect();
  runtime = makeRuntime();
});
afterEach(() => {
  warnings.length = 0;
});
afterAll(async () => {
  for (const rt of runtimes) await rt.close();
  redis.disconnect();
  await deleteRuntimeKeys(prefix);
});

describe('runs that ended lately', () => {
  it('are noted beside the active runs when they end', async () => {
    const worker = runtime.createWorker({ sweepEveryMs: 0 });
    try {
      await worker.ready();
      const before = Date.now();
      const handle = await runtime.start(plan, null, { runId: 'noted' });
      expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
      const endedAt = await waitEnded('noted');
      expect(endedAt).toBeGreaterThanOrEqual(before);
      expect(endedAt).toBeLessThanOrEqual(Date.now());
      expect(await redis.sismember(keys.activeRuns(), 'noted')).toBe(0);
    } finally {
      await worker.close();
    }
  });

  it('drives a run whose state went back after its end again, from where it went back', async () => {
    // One job per unit: the jobs of b and c run, and BullMQ keeps their ids once done.
    const worker = runtime.createWorker({ sweepEveryMs: 0, chainMs: 0 });
    await worker.ready();
    const saved = await runWithSavedState(runtime, 'back');
    await waitEnded('back');
    await worker.close();
    expect(counts('back')).toEqual([1, 1, 1]);
    // The run's slot went back to before b's commit; the active runs and the note did not.
    await restoreRun('back', saved);
    const handle = await runtime.attach('back');
    expect((await handle.status()).status).toBe('running');
    expect(await redis.sismember(keys.activeRuns(), 'back')).toBe(0);
    // A worker that starts sweeps: b and c run again, a does not.
    const next = runtime.createWorker({ sweepEveryMs: 0 });
    try {
      await next.ready();
      expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
      expect(counts('back')).toEqual([1, 2, 2]);
      expect(warnings.map((w) => [w.message.slice(0, 34), w.fields])).toEqual([
        [
          'a run that ended is going on again',
          expect.objectContaining({ runId: 'back', status: 'running' }),
        ],
      ]);
      // Ended again: noted again, not active, its keys given their expiry with a tombstone.
      await waitEnded('back');
      expect(await redis.exists(keys.removed('back'))).toBe(1);
      expect(await redis.pttl(keys.snap('back'))).toBeGreaterThan(0);
      const listed = (await runtime.list({ limit: 20 })).find((r) => r.runId === 'back');
      expect(listed?.status).toBe('succeeded');
    } finally {
      await next.close();
    }
  });

  it('are driven again by the periodic sweep of a running worker', async () => {
    const worker = runtime.createWorker({ sweepEveryMs: 200, recoverOnStart: false });
    try {
      await worker.ready();
      const saved = await runWithSavedState(runtime, 'back-sweep');
      await waitEnded('back-sweep');
      await restoreRun('back-sweep', saved);
      const handle = await runtime.attach('back-sweep');
      expect((await handle.status()).status).toBe('running');
      expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
      expect(counts('back-sweep')).toEqual([1, 2, 2]);
      expect(warnings.filter((w) => w.fields['runId'] === 'back-sweep')).toHaveLength(1);
      // Later sweeps leave it: it stayed ended this time.
      await new Promise((r) => setTimeout(r, 600));
      expect(counts('back-sweep')).toEqual([1, 2, 2]);
    } finally {
      await worker.close();
    }
  });

  it('drive a run put back among the active runs by a sweep that stopped there', async () => {
    const worker = runtime.createWorker({ sweepEveryMs: 0, chainMs: 0 });
    await worker.ready();
    const saved = await runWithSavedState(runtime, 'half');
    const endedAt = await waitEnded('half');
    await worker.close();
    await restoreRun('half', saved);
    // A sweep put it back and died before it enqueued anything: the jobs of b and c are done.
    await redis.sadd(keys.activeRuns(), 'half');
    const next = runtime.createWorker({ sweepEveryMs: 0, chainMs: 0 });
    try {
      await next.ready();
      const handle = await runtime.attach('half');
      expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
      expect(counts('half')).toEqual([1, 2, 2]);
      // The walk of the active runs finds b due with its job done, and no commit since.
      expect(warnings.map((w) => [w.message.slice(0, 30), w.fields['runId']])).toEqual([
        ['a unit of an active run is due', 'half'],
      ]);
      expect(await waitEnded('half')).toBeGreaterThan(endedAt);
    } finally {
      await next.close();
    }
  });

  it('drop the note of a failed run that was resumed, with no warning', async () => {
    const flaky: PlanInput = {
      name: 'flaky',
      steps: [{ id: 'a', kind: 'operator', operator: 'flaky', retry: { maxAttempts: 1 } }],
    };
    let failing = true;
    runtime.operator('flaky', () => {
      if (failing) throw Object.assign(new Error('not yet'), { retryable: false });
      return null;
    });
    const worker = runtime.createWorker({ sweepEveryMs: 200 });
    try {
      await worker.ready();
      const handle = await runtime.start(flaky, null, { runId: 'resumed' });
      expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('failed');
      await waitEnded('resumed');
      failing = false;
      await runtime.resume('resumed');
      expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
      await new Promise((r) => setTimeout(r, 500)); // a few sweeps
      expect(warnings).toEqual([]);
      expect(await redis.sismember(keys.activeRuns(), 'resumed')).toBe(0);
    } finally {
      await worker.close();
    }
  });

  it('an active run whose state went back is driven on: finished jobs of its units are replaced', async () => {
    const worker = runtime.createWorker({ sweepEveryMs: 200, chainMs: 0 });
    try {
      await worker.ready();
      const b = holdStep('mid/b');
      const c = holdStep('mid/c');
      const handle = await runtime.start(plan, null, { runId: 'mid' });
      await b.inside;
      const saved = await dumpRun('mid');
      b.release();
      await c.inside;
      // b's commit (and its job's end) are kept by the queue, not by the run: b is due again,
      // under the id of a job that has finished.
      await restoreRun('mid', saved);
      c.release();
      expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
      expect(counts('mid')).toEqual([1, 2, 2]);
      expect(warnings.map((w) => [w.message.slice(0, 30), w.fields['runId']])).toEqual([
        ['a unit of an active run is due', 'mid'],
      ]);
    } finally {
      await worker.close();
    }
  });

  it('leave a run that stayed ended untouched', async () => {
    const worker = runtime.createWorker({ sweepEveryMs: 200 });
    try {
      await worker.ready();
      const handle = await runtime.start(plan, null, { runId: 'stays' });
      expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
      const endedAt = await waitEnded('stays');
      const snap = await redis.hgetall(keys.snap('stays'));
      await new Promise((r) => setTimeout(r, 800)); // a few sweeps
      expect(counts('stays')).toEqual([1, 1, 1]);
      expect(await redis.hgetall(keys.snap('stays'))).toEqual(snap);
      expect(Number(await redis.zscore(keys.endedRuns(), 'stays'))).toBe(endedAt);
      expect(await redis.sismember(keys.activeRuns(), 'stays')).toBe(0);
      expect(warnings).toEqual([]);
    } finally {
      await worker.close();
    }
  });

  it('are checked only within the window: a run that went back later stays as it is', async () => {
    const p = testPrefix();
    const k = createKeys(p);
    const rt = makeRuntime({ prefix: p, endedRunsCheckMs: 300 });
    try {
      const worker = rt.createWorker({ sweepEveryMs: 0 });
      await worker.ready();
      const saved = await runWithSavedState(rt, 'late', p);
      await waitEnded('late', k);
      await worker.close();
      await new Promise((r) => setTimeout(r, 400)); // past the window
      await restoreRun('late', saved, p);
      const next = rt.createWorker({ sweepEveryMs: 0 });
      await next.ready();
      await next.close();
      expect(counts('late')).toEqual([1, 1, 1]);
      expect(await redis.zcard(k.endedRuns())).toBe(0);
      expect((await (await rt.attach('late')).status()).status).toBe('running');
      expect(warnings).toEqual([]);
    } finally {
      await deleteRuntimeKeys(p);
    }
  });

  it('drop a run whose keys are all gone, with a warning unless retention removed it', async () => {
    const worker = runtime.createWorker({ sweepEveryMs: 200, recoverOnStart: false });
    try {
      await worker.ready();
      for (const runId of ['gone', 'expired']) {
        const handle = await runtime.start(plan, null, { runId });
        expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
        await waitEnded(runId);
      }
      // 'gone': every key of it, tombstone included; 'expired': its keys but the tombstone.
      await redis.del(...(await runKeys('gone')));
      await redis.del(...(await runKeys('expired')).filter((k) => k !== keys.removed('expired')));
      const noted = () =>
        Promise.all(['gone', 'expired'].map((id) => redis.zscore(keys.endedRuns(), id)));
      const until = Date.now() + 3000;
      while ((await noted()).some((score) => score !== null) && Date.now() < until) {
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(await noted()).toEqual([null, null]);
      expect(warnings.map((w) => w.fields['runId'])).toEqual(['gone']);
      expect(warnings[0]!.message).toContain('cannot be driven again');
      expect(await redis.smismember(keys.activeRuns(), 'gone', 'expired')).toEqual([0, 0]);
    } finally {
      await worker.close();
    }
  });

  it('leave the active runs once their snapshot says they ended', async () => {
    const worker = runtime.createWorker({ sweepEveryMs: 200, recoverOnStart: false });
    try {
      await worker.ready();
      const handle = await runtime.start(plan, null, { runId: 'listed' });
      expect((await handle.settled({ timeoutMs: 5000 })).status).toBe('succeeded');
      await waitEnded('listed');
      // Its removal from the active runs was lost (the active runs' slot went back).
      await redis.sadd(keys.activeRuns(), 'listed');
      await redis.zrem(keys.endedRuns(), 'listed');
      await waitEnded('listed');
      expect(counts('listed')).toEqual([1, 1, 1]);
      expect(warnings).toEqual([]);
    } finally {
      await worker.close();
    }
  });

  it('refuses a window that is not 0 or a whole number of ms', () => {
    for (const bad of [-1, 1.5, Number.NaN, '1000']) {
      let error: unknown;
      try {
        createRuntime({ redis: redisUrl(), prefix, endedRunsCheckMs: bad as number });
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(InputValidationError);
      expect((error as InputValidationError).issues[0]!.path).toBe('endedRunsCheckMs');
    }
  });
});
