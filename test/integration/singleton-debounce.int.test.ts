/**
 * Singleton and debounced starts. Singleton `skip`: 10 concurrent starts of one key, from this
 * process and two others, make one run (the run list and the operator's calls count it); the key
 * is released when the run ends. `cancel_previous`: the live run is cancelled, the new one runs.
 * Debounce: 10 starts 50 ms apart with a 300 ms delay make one run with the last input; with
 * `maxDelayMs` a burst that goes on starts its run in time. Refused options name the field and
 * write nothing.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InputValidationError } from '../../src/errors.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, runtimeCore, type Runtime, type RunHandle } from '../../src/runtime.js';
import type { FlujoWorker } from '../../src/worker/worker.js';
import { caught } from '../helpers/caught.js';
import { pinnedNode, root, spawnChild } from '../helpers/cli.js';
import { connect, deleteRuntimeKeys, readPrefix, redisUrl, testPrefix } from '../helpers/redis.js';

const plan: PlanInput = {
  name: 'keyed',
  steps: [{ id: 'work', kind: 'operator', operator: 'work' }],
};

const prefix = testPrefix();
let redis: Redis;
let runtime: Runtime;
let worker: FlujoWorker;
/** The input `n` of each call of the operator, by run id. */
const calls: { runId: string; n: number; at: number }[] = [];
/** How long the operator takes. */
let workMs = 50;

beforeAll(async () => {
  redis = connect();
  runtime = createRuntime({ redis: redisUrl(), prefix }).operator(
    'work',
    async ({ runId, input, signal }) => {
      calls.push({ runId, n: (input as { n: number }).n, at: Date.now() });
      // A cancelled run's call ends at once (its worker slot is free again).
      await sleep(workMs, undefined, { signal }).catch(() => {});
      return (input as { n: number }).n;
    },
  );
  worker = runtime.createWorker({ concurrency: 4 });
  await worker.ready();
});
afterAll(async () => {
  await worker.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
  redis.disconnect();
});

/**
 * A child process that starts `count` runs with start option `option` once {@link go} is called;
 * resolves when it is ready (connected), then `result` gives each start's handle.
 */
async function childStarts(count: number, option: unknown, n0: number) {
  const env = {
    ...process.env,
    REDIS_URL: redisUrl(),
    FLUJO_PREFIX: prefix,
    COUNT: String(count),
    OPTION: JSON.stringify(option),
    N0: String(n0),
  };
  const script = join(root, 'test', 'fixtures', 'keyed-starts.ts');
  const child = spawnChild(pinnedNode, ['--import', 'tsx', script], { env, timeoutMs: 150_000 });
  await expect.poll(() => child.out().includes('ready'), { timeout: 90_000 }).toBe(true);
  const result = child.done.then((r) => {
    if (r.code !== 0) throw new Error(`child exited ${r.code}: ${r.err}`);
    return r.lines.filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Partial<RunHandle>);
  });
  return { go: () => child.child.stdin!.write('go\n'), result };
}

const runsOfPlan = async () => (await runtime.list()).filter((r) => r.planName === 'keyed');

describe('singleton starts', { timeout: 240_000 }, () => {
  it('skip: 10 concurrent starts from three processes make one run; the key is free once it ended', async () => {
    calls.length = 0;
    workMs = 3000;
    const option = { singleton: { key: 'inbox-1', mode: 'skip' } } as const;
    const children = await Promise.all([childStarts(3, option, 100), childStarts(3, option, 200)]);
    for (const c of children) c.go();
    const here = await Promise.all(
      Array.from({ length: 4 }, (_, i) => runtime.start(plan, { n: i }, option)),
    );
    const all = [...here, ...(await Promise.all(children.map((c) => c.result))).flat()];
    expect(all).toHaveLength(10);
    const ids = new Set(all.map((h) => h.runId));
    expect(
      ids.size,
      JSON.stringify(all.map(({ runId, created, skipped }) => ({ runId, created, skipped }))),
    ).toBe(1);
    expect(all.filter((h) => h.created === true)).toHaveLength(1);
    expect(all.filter((h) => h.skipped === true)).toHaveLength(9);
    const [runId] = [...ids] as [string];
    expect((await runtime.attach(runId).then((h) => h.settled({ timeoutMs: 20_000 }))).status).toBe(
      'succeeded',
    );
    expect(await runsOfPlan()).toHaveLength(1);
    expect(calls.map((c) => c.runId)).toEqual([runId]);
    // Released when it ended: the next start makes a new run.
    await expect
      .poll(() => runtimeCore(runtime).stores.singletons.holder('default', 'inbox-1'), {
        timeout: 10_000,
      })
      .toBeNull();
    workMs = 50;
    const next = await runtime.start(plan, { n: 9 }, option);
    expect(next.created).toBe(true);
    expect(next.skipped).toBeUndefined();
    expect((await next.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    expect(await runsOfPlan()).toHaveLength(2);
  });

  it('skip: a holder that ended without releasing its key (a crash in between) is cleared by the next start', async () => {
    workMs = 20;
    const key = 'inbox-stale';
    const first = await runtime.start(plan, { n: 1 }, { singleton: { key } });
    expect((await first.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    // As if the process died after the run's end, before the release.
    await redis.hset(
      runtimeCore(runtime).stores.keys.singletons('default'),
      key,
      `${Date.now()}|${first.runId}`,
    );
    const second = await runtime.start(plan, { n: 2 }, { singleton: { key } });
    expect(second.created).toBe(true);
    expect(second.runId).not.toBe(first.runId);
    expect((await second.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
  });

  it('cancel_previous: the live run of the key is cancelled and the new one runs', async () => {
    workMs = 3000;
    calls.length = 0;
    const option = { singleton: { key: 'inbox-2', mode: 'cancel_previous' } } as const;
    const first = await runtime.start(plan, { n: 1 }, option);
    await expect.poll(() => calls.length, { timeout: 10_000 }).toBe(1);
    workMs = 50;
    const second = await runtime.start(plan, { n: 2 }, option);
    expect(second.created).toBe(true);
    expect(second.cancelled).toBe(first.runId);
    expect((await first.status()).status).toBe('cancelled');
    expect((await second.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    // Released once its end is processed (just after the status change `settled` waits for).
    await expect
      .poll(() => runtimeCore(runtime).stores.singletons.holder('default', 'inbox-2'), {
        timeout: 10_000,
      })
      .toBeNull();
  });

  it('cancel_previous: 6 concurrent starts from two processes leave one live run', async () => {
    workMs = 3000;
    calls.length = 0;
    const option = { singleton: { key: 'inbox-3', mode: 'cancel_previous' } } as const;
    const child = await childStarts(3, option, 100);
    child.go();
    const here = await Promise.all(
      Array.from({ length: 3 }, (_, i) => runtime.start(plan, { n: i }, option)),
    );
    const all = [...here, ...(await child.result)];
    expect(new Set(all.map((h) => h.runId)).size).toBe(6);
    const reports = await Promise.all(
      all.map((h) => runtime.attach(h.runId!).then((r) => r.settled({ timeoutMs: 20_000 }))),
    );
    expect(reports.filter((r) => r.status === 'succeeded')).toHaveLength(1);
    expect(reports.filter((r) => r.status === 'cancelled')).toHaveLength(5);
    workMs = 50;
  });
});

describe('debounced starts', { timeout: 60_000 }, () => {
  it('10 starts 50 ms apart with delayMs 300 make one run, with the last input', async () => {
    calls.length = 0;
    workMs = 20;
    const before = (await runsOfPlan()).length;
    const handles: RunHandle[] = [];
    for (let i = 0; i < 10; i++) {
      handles.push(await runtime.start(plan, { n: i }, { debounce: { key: 'd-1', delayMs: 300 } }));
      await sleep(50);
    }
    const ids = new Set(handles.map((h) => h.runId));
    expect(ids.size).toBe(1);
    expect(handles.every((h) => h.created === false)).toBe(true);
    expect(handles.map((h) => h.debounce!.first)).toEqual([
      true,
      ...Array.from({ length: 9 }, () => false),
    ]);
    const report = await handles[9]!.settled({ timeoutMs: 10_000 });
    expect(report.status).toBe('succeeded');
    expect(calls).toEqual([expect.objectContaining({ runId: handles[0]!.runId, n: 9 })]);
    // Started once the burst went quiet: 300 ms after the last start at the soonest.
    const lastStart = handles[9]!.debounce!.dueAt - 300;
    expect(calls[0]!.at).toBeGreaterThanOrEqual(lastStart + 300 - 5);
    await sleep(500);
    expect((await runsOfPlan()).length).toBe(before + 1);
  });

  it('maxDelayMs: a burst that goes on starts its run at most that long after its first start', async () => {
    calls.length = 0;
    const handles: RunHandle[] = [];
    const t0 = Date.now();
    const option = { debounce: { key: 'd-2', delayMs: 300, maxDelayMs: 600 } };
    for (let i = 0; Date.now() - t0 < 1500; i++) {
      handles.push(await runtime.start(plan, { n: i }, option));
      await sleep(50);
    }
    const bursts = [...new Set(handles.map((h) => h.runId))];
    expect(bursts.length).toBeGreaterThanOrEqual(2);
    const first = handles.filter((h) => h.runId === bursts[0]);
    expect(Math.max(...first.map((h) => h.debounce!.dueAt))).toBeLessThanOrEqual(t0 + 600 + 50);
    for (const id of bursts) {
      const h = handles.find((x) => x.runId === id)!;
      expect((await h.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    }
    // One run per burst, each with its burst's last input.
    expect(calls.map((c) => c.runId).sort()).toEqual([...bursts].sort());
    for (const c of calls) {
      const last = handles.filter((h) => h.runId === c.runId).length;
      const index = handles.findLastIndex((h) => h.runId === c.runId);
      expect(last).toBeGreaterThan(0);
      expect(c.n).toBe(index);
    }
    // The first burst's run started within maxDelayMs of its first start (and the worker's pace).
    const firstCall = calls.find((c) => c.runId === bursts[0])!;
    expect(firstCall.at - t0).toBeLessThan(600 + 400);
  });
});

describe('refused start options', () => {
  it('a debounce delay of 0, an empty key, a bad mode or priority: a clear error naming the field, nothing written', async () => {
    await sleep(300);
    // Every key of the runtime and its queue, but what a running worker writes on its own: its
    // stalled-job check stamp and its heartbeats.
    const read = async () => {
      const all = {
        ...(await readPrefix(redis, `${prefix}:`)),
        ...(await readPrefix(redis, `{${prefix}:`)),
      };
      return Object.fromEntries(
        Object.entries(all).filter(
          ([k]) => !k.endsWith('stalled-check') && !k.startsWith(`{${prefix}:workers}`),
        ),
      );
    };
    const before = await read();
    const cases: [Record<string, unknown>, string][] = [
      [{ debounce: { key: 'd', delayMs: 0 } }, 'debounce.delayMs'],
      [{ debounce: { key: '', delayMs: 100 } }, 'debounce.key'],
      [{ debounce: { key: 'd', delayMs: 100, maxDelayMs: 50 } }, 'debounce.maxDelayMs'],
      [{ debounce: { key: 'd', delayMs: 100 }, runId: 'x' }, 'runId'],
      [{ debounce: { key: 'd', delayMs: 100 }, priority: 2.5 }, 'priority'],
      [{ singleton: { key: '' } }, 'singleton.key'],
      [{ singleton: { key: 'k', mode: 'replace' } }, 'singleton.mode'],
      [{ singleton: { key: 'k' }, priority: '1' }, 'priority'],
      [{ priority: 1.5 }, 'priority'],
    ];
    for (const [options, path] of cases) {
      const error = await caught(runtime.start(plan, { n: 0 }, options));
      expect(error, JSON.stringify(options)).toBeInstanceOf(InputValidationError);
      expect((error as InputValidationError).issues.map((i) => i.path)).toContain(path);
    }
    expect(await read()).toEqual(before);
  });
});
