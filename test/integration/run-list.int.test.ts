/**
 * `runtime.list(filter)`: runs newest first with plan, tenant, status, start, duration and the step
 * that waits; filters; entries of runs that no longer exist are skipped and removed; finished runs
 * older than `retention.finishedRunsMs` are trimmed, failed ones only with `failedRunsMs`; a bad
 * filter is refused before any read.
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  createRuntime,
  InputValidationError,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { connect, deleteRuntimeKeys, readPrefix, redisUrl } from '../helpers/redis.js';
import { createKeys } from '../../src/persistence/keys.js';
import { createRunIndex } from '../../src/persistence/run-index.js';

let prefix: string;
let redis: Redis;
let rt: Runtime;
let worker: FlujoWorker | undefined;
let skew: number;
const clock = () => Date.now() + skew;

const line = (name: string, operator: string): PlanInput => ({
  name,
  steps: [{ id: 's', kind: 'operator', operator, retry: { maxAttempts: 1 } }],
});
const gated: PlanInput = {
  name: 'alpha',
  steps: [
    { id: 'gate', kind: 'human_gate' },
    { id: 's', kind: 'operator', operator: 'ok', dependsOn: ['gate'] },
  ],
};

function runtime(options: { finishedRunsMs?: number; failedRunsMs?: number } = {}): Runtime {
  return createRuntime({
    redis: redisUrl(),
    prefix,
    clock,
    ...(Object.keys(options).length === 0 ? {} : { retention: options }),
    operators: {
      ok: () => ({ ok: true }),
      bad: () => {
        throw Object.assign(new Error('no'), { retryable: false });
      },
    },
  });
}

beforeEach(() => {
  prefix = `t-${randomUUID().slice(0, 8)}`;
  redis = connect();
  skew = 0;
  rt = runtime();
});
afterEach(async () => {
  await worker?.close();
  worker = undefined;
  await rt.close();
  redis.disconnect();
  await deleteRuntimeKeys(prefix);
});

/** Four runs, 10 ms apart: succeeded (alpha, acme), failed (beta, acme), waiting (alpha, zen), running (beta, zen). */
async function fourRuns(): Promise<{ ids: string[] }> {
  worker = rt.createWorker({ concurrency: 2 });
  await worker.ready();
  const ids: string[] = [];
  const start = async (plan: PlanInput, tenantId: string) => {
    skew += 10;
    const run = await rt.start(plan, null, { tenantId });
    ids.push(run.runId);
    await run.settled({ timeoutMs: 10_000 });
  };
  await start(line('alpha', 'ok'), 'acme');
  await start(line('beta', 'bad'), 'acme');
  await start(gated, 'zen');
  await worker.close();
  worker = undefined;
  skew += 10;
  ids.push((await rt.start(line('beta', 'ok'), null, { tenantId: 'zen' })).runId);
  return { ids };
}

describe('runtime.list', () => {
  it('lists runs newest first with status, plan, tenant, duration and the step that waits', async () => {
    const { ids } = await fourRuns();
    const [ok, bad, waiting, running] = ids;
    const all = await rt.list();
    expect(all.map((r) => [r.runId, r.planName, r.tenantId, r.status])).toEqual([
      [running, 'beta', 'zen', 'running'],
      [waiting, 'alpha', 'zen', 'waiting'],
      [bad, 'beta', 'acme', 'failed'],
      [ok, 'alpha', 'acme', 'succeeded'],
    ]);
    expect(all[1]!.waitingStep).toBe('gate');
    // A failed run says where and why it stopped; the others have no such fields set.
    expect(all[2]).toMatchObject({ blockedStep: 's', reason: 'unknown' });
    expect(all.filter((r) => r.blockedStep !== null || r.reason !== null)).toHaveLength(1);
    expect(all[0]).toMatchObject({ currentStep: 's', endedAt: null, waitingStep: null });
    expect(all[3]!.endedAt).toBeGreaterThanOrEqual(all[3]!.createdAt);
    expect(all[3]!.durationMs).toBe(all[3]!.endedAt! - all[3]!.createdAt);
  });

  it('filters by status, plan, tenant, start time and limit', async () => {
    const { ids } = await fourRuns();
    const [ok, bad, waiting, running] = ids;
    // Start times as stored (the runs are 10 ms apart).
    const at = (await rt.list()).map((r) => r.createdAt).reverse();
    const idsOf = async (filter: Parameters<Runtime['list']>[0]) =>
      (await rt.list(filter)).map((r) => r.runId);
    expect(await idsOf({ status: 'failed' })).toEqual([bad]);
    expect(await idsOf({ status: ['succeeded', 'running'] })).toEqual([running, ok]);
    expect(await idsOf({ plan: 'alpha' })).toEqual([waiting, ok]);
    expect(await idsOf({ tenantId: 'zen' })).toEqual([running, waiting]);
    expect(await idsOf({ tenantId: 'acme', status: 'succeeded' })).toEqual([ok]);
    expect(await idsOf({ since: at[1]! })).toEqual([running, waiting, bad]);
    expect(await idsOf({ until: new Date(at[1]!) })).toEqual([bad, ok]);
    expect(await idsOf({ since: at[1]!, until: at[2]! })).toEqual([waiting, bad]);
    expect(await idsOf({ limit: 2 })).toEqual([running, waiting]);
    expect(await idsOf({ plan: 'nope' })).toEqual([]);
  });

  it('skips and removes entries of runs that no longer exist; trims finished runs past retention', async () => {
    const { ids } = await fourRuns();
    const [ok, bad, waiting, running] = ids;
    // The run's keys expired (as retention does): the entry is skipped, and removed once old enough.
    await redis.del(`${prefix}:{${ok}}:snap`);
    expect((await rt.list()).map((r) => r.runId)).toEqual([running, waiting, bad]);
    expect(await redis.zscore(`{${prefix}:runs}:index`, ok!)).not.toBeNull();
    skew += 61_000;
    expect((await rt.list()).map((r) => r.runId)).toEqual([running, waiting, bad]);
    expect(await redis.zscore(`{${prefix}:runs}:index`, ok!)).toBeNull();

    // The failed run ended more than 30 s ago (by the clock); the others have not ended. A failed
    // run is kept (its keys have no expiry): so is its entry.
    const kept = runtime({ finishedRunsMs: 30_000 });
    try {
      expect((await kept.list()).map((r) => r.runId)).toEqual([running, waiting, bad]);
      expect(await redis.zcard(`{${prefix}:runs}:index`)).toBe(3);
    } finally {
      await kept.close();
    }
    const trimmed = runtime({ finishedRunsMs: 30_000, failedRunsMs: 30_000 });
    try {
      expect((await trimmed.list()).map((r) => r.runId)).toEqual([running, waiting]);
      expect(await redis.zcard(`{${prefix}:runs}:index`)).toBe(2);
      expect(await redis.hexists(`{${prefix}:runs}:info`, bad!)).toBe(0);
    } finally {
      await trimmed.close();
    }
  });

  it('a trim steps over the entries it keeps (runs not ended, failed runs kept) to those after them', async () => {
    const index = createRunIndex(redis, createKeys(prefix));
    // Oldest first; all but `late` ended before the cut (1000).
    const entries: [string, string | null][] = [
      ['failedA', 'failed'],
      ['open', null],
      ['failedB', 'failed'],
      ['done', 'succeeded'],
      ['stopped', 'cancelled'],
      ['late', 'succeeded'],
    ];
    for (const [i, [runId, status]] of entries.entries()) {
      await index.add({ runId, planName: 'p', tenantId: 't', createdAt: i + 1 });
      if (status !== null) await index.ended(runId, status, runId === 'late' ? 5000 : 100);
    }
    const ids = async () => (await index.page(-Infinity, Infinity, 0, 10)).map((e) => e.runId);
    // Batches of two: the first holds only entries it keeps.
    expect(await index.trim({ finished: 1000, failed: null }, 2)).toBe(2);
    expect(await ids()).toEqual(['late', 'failedB', 'open', 'failedA']);
    expect(await index.trim({ finished: 1000, failed: 50 }, 2)).toBe(0);
    expect(await index.trim({ finished: 1000, failed: 1000 }, 2)).toBe(2);
    expect(await ids()).toEqual(['late', 'open']);
  });

  it('a starting worker lists the unfinished runs the index does not have', async () => {
    const run = await rt.start(line('old', 'ok'), null, { tenantId: 'acme' });
    // As if the run was started before the run list existed.
    await redis.del(`{${prefix}:runs}:index`, `{${prefix}:runs}:info`);
    expect(await rt.list()).toEqual([]);
    worker = rt.createWorker({ concurrency: 1 });
    await worker.ready();
    const listed = await rt.list();
    expect(listed.map((r) => [r.runId, r.planName, r.tenantId])).toEqual([
      [run.runId, 'old', 'acme'],
    ]);
  });

  it('a replay or regeneration is listed, with its plan and status, as soon as it is created', async () => {
    worker = rt.createWorker({ concurrency: 1 });
    await worker.ready();
    const original = await rt.start(line('alpha', 'ok'), null, { tenantId: 'acme' });
    expect((await original.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await worker.close();
    worker = undefined;
    // No worker runs from here on: the replays are listed by their creation alone.
    skew += 10;
    const replayed = await rt.replay(original.runId, { mode: 'replay' });
    skew += 10;
    const regenerated = await rt.replay(original.runId, { mode: 'regenerate' });
    const listed = await rt.list();
    expect(listed.map((r) => [r.runId, r.planName, r.tenantId, r.status, r.currentStep])).toEqual([
      [regenerated.runId, 'alpha', 'acme', 'running', 's'],
      [replayed.runId, 'alpha', 'acme', 'running', 's'],
      [original.runId, 'alpha', 'acme', 'succeeded', null],
    ]);
    expect((await rt.list({ status: 'running' })).map((r) => r.runId)).toEqual([
      regenerated.runId,
      replayed.runId,
    ]);
  });

  it('a resumed run is listed as running again', async () => {
    const { ids } = await fourRuns();
    const bad = ids[1]!;
    expect((await rt.list({ status: 'failed' })).map((r) => r.runId)).toEqual([bad]);
    await rt.resume(bad, { by: 'ana' });
    expect((await rt.list({ status: 'running' })).map((r) => r.runId)).toContain(bad);
    expect(await rt.list({ status: 'failed' })).toEqual([]);
  });

  it('refuses a bad filter naming each field, before reading or writing anything', async () => {
    await fourRuns();
    const before = await readPrefix(redis, `{${prefix}:runs}`);
    const refused = await rt
      .list({ status: 'done' as never, limit: 0, since: Number.NaN, plan: '' })
      .catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(InputValidationError);
    expect((refused as InputValidationError).issues.map((i) => i.path).sort()).toEqual([
      'limit',
      'plan',
      'since',
      'status',
    ]);
    expect(await readPrefix(redis, `{${prefix}:runs}`)).toEqual(before);
    expect(() => createRuntime({ redis: redisUrl(), retention: { finishedRunsMs: -1 } })).toThrow(
      /retention\.finishedRunsMs/,
    );
  });
});
