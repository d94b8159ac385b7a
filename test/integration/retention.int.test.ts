/**
 * Retention: a finished run's keys (snapshot, events, outputs, ledger, journal, history, blobs,
 * meta, counters, fingerprints, usage, request key) all expire; a run that waits or goes on keeps
 * them, and so does a failed run unless `failedRunsMs` is set; a removed run is reported as
 * removed, not unknown. On the scripted model server (an agent step writes every kind of key) and a
 * real Redis.
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  InputValidationError,
  RunNotFoundError,
  RunRemovedError,
  type FlujoWorker,
  type RetentionOptions,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { runFlujo } from '../helpers/cli.js';
import { connect, deleteRuntimeKeys, redisUrl, scanKeys } from '../helpers/redis.js';
import { runtimeCore } from '../../src/runtime.js';

// Long enough for the assertions made while the keys are still there, on a loaded machine.
const RETENTION_MS = 6000;

/** `flujo <args>` of the built package on this test's prefix: its exit code and all its output. */
async function flujo(args: string[]): Promise<{ code: number | null; out: string }> {
  const r = await runFlujo(args, { prefix });
  return { code: r.code, out: r.out + r.err };
}

let model: ScriptedModelServer;
let redis: Redis;
let runtime: Runtime;
let workers: FlujoWorker[];
let prefix: string;
let failFirst: Set<string>;

const fetchPage = defineTool({
  name: 'fetch_page',
  input: z.object({ url: z.string() }),
  idempotent: true,
  // Over the blob threshold: the result is stored as a blob of the run.
  run: ({ url }) => ({ url, body: `<p>${'y'.repeat(30_000)}</p>` }),
});

function start(retention: RetentionOptions = { finishedRunsMs: RETENTION_MS }): void {
  const agent = defineAgent({
    name: 'researcher',
    model: 'gpt-4o-mini',
    provider: { baseURL: model.url, apiKey: 'test-key' },
    systemPrompt: 'Research, then answer.',
    tools: [fetchPage],
    settings: { maxTokens: 100 },
    timeoutMs: 2000,
  });
  runtime = createRuntime({
    redis: redisUrl(),
    prefix,
    retention,
    pricing: { models: { 'gpt-4o-mini': { inputPerMillion: 0.15, outputPerMillion: 0.6 } } },
  })
    .agent(agent)
    .operator('after', ({ stepId }) => {
      if (failFirst.delete(stepId)) throw new Error('not yet');
      return { done: stepId };
    });
}

/** The runtime again, with these retention options (before any worker is started). */
async function restart(retention: RetentionOptions): Promise<void> {
  await runtime.close();
  start(retention);
}

async function startWorker(): Promise<FlujoWorker> {
  const worker = runtime.createWorker({ concurrency: 2, recoveryMs: 1000 });
  workers.push(worker);
  await worker.ready();
  return worker;
}

const agentPlan = (gate = false): PlanInput => ({
  name: 'kept',
  steps: [
    { id: 'research', kind: 'agent', agent: 'researcher', mode: 'granular' },
    {
      id: 'after',
      kind: 'operator',
      operator: 'after',
      dependsOn: ['research'],
      retry: { maxAttempts: 1 },
      ...(gate ? { gate: { reason: 'check first' } } : {}),
    },
  ],
});

function scriptAgent(): void {
  model.enqueue(
    { toolCalls: [{ id: 'c1', name: 'fetch_page', arguments: { url: 'https://a.example' } }] },
    { text: 'Done.', usage: { prompt_tokens: 100, completion_tokens: 5 } },
  );
}

/** Every key of the run: its hash tag, its usage keys in the tenant's tag, its request key. */
async function keysOf(runId: string, requestKey?: string): Promise<string[]> {
  const out: string[] = [];
  for (const key of await scanKeys(redis, `${prefix}*`)) {
    if (key.includes(`{${runId}}`) || key.endsWith(`:${runId}`)) out.push(key);
    else if (requestKey !== undefined && key.endsWith(`:request:default:${requestKey}`)) {
      out.push(key);
    }
  }
  return out.sort();
}

async function ttls(keys: readonly string[]): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const key of keys) out[key.slice(prefix.length)] = await redis.pttl(key);
  return out;
}

async function until(check: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error('timed out waiting');
    await new Promise((ok) => setTimeout(ok, 50));
  }
}

beforeAll(async () => {
  model = await startScriptedModelServer();
  redis = connect();
});
afterAll(async () => {
  await model.close();
  redis.disconnect();
});
beforeEach(() => {
  model.reset();
  prefix = `t-${randomUUID().slice(0, 8)}`;
  workers = [];
  failFirst = new Set();
  start();
});
afterEach(async () => {
  for (const w of workers) await w.close();
  await runtime.close();
  await deleteRuntimeKeys(prefix);
});

describe('retention of finished runs', () => {
  it('every key of a finished run expires; what remains is a tombstone, and status says so', async () => {
    await startWorker();
    scriptAgent();
    const run = await runtime.start(agentPlan(), 'Go.', { requestKey: 'rk-1' });
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    const records = (await runtime.usage(run.runId)).reservations.map((r) => r.id);
    expect(records.length).toBe(2);
    // Set right after the final commit, by the worker that made it.
    await until(
      async () => (await redis.exists(runtimeCore(runtime).stores.keys.removed(run.runId))) === 1,
    );
    const keys = await keysOf(run.runId, 'rk-1');
    const kinds = keys.map((k) => k.slice(k.indexOf('}') + 1));
    for (const kind of [
      ':snap',
      ':events',
      ':outputs',
      ':meta',
      ':journal',
      ':history:research',
      ':blobs',
      ':fingerprints',
      ':removed',
    ]) {
      expect(kinds).toContain(kind);
    }
    expect(kinds.some((k) => k.startsWith(':blob:'))).toBe(true);
    expect(kinds.some((k) => k.startsWith(':ledger'))).toBe(true);
    expect(kinds.some((k) => k.startsWith(':usage:'))).toBe(true);
    expect(keys.some((k) => k.endsWith(':request:default:rk-1'))).toBe(true);
    // Every key has the finished-run expiry (the tombstone a longer one): none was deleted yet.
    const before = await ttls(keys);
    for (const [key, ttl] of Object.entries(before)) {
      if (key.endsWith(':removed')) expect(ttl).toBeGreaterThan(RETENTION_MS);
      else expect([key, ttl > 0 && ttl <= RETENTION_MS]).toEqual([key, true]);
    }

    await until(
      async () => (await redis.exists(runtimeCore(runtime).stores.keys.snap(run.runId))) === 0,
    );
    await new Promise((ok) => setTimeout(ok, 100));
    expect(await keysOf(run.runId, 'rk-1')).toEqual([
      runtimeCore(runtime).stores.keys.removed(run.runId),
    ]);

    const status = runtime.status(run.runId);
    await expect(status).rejects.toBeInstanceOf(RunRemovedError);
    await expect(runtime.status(run.runId)).rejects.toThrow(/was removed by retention/);
    // Still a "not found" to code that handles that, and for events too.
    await expect(runtime.attach(run.runId)).rejects.toBeInstanceOf(RunNotFoundError);
    await expect(
      (async () => {
        for await (const _ of runtime.events(run.runId)) void _;
      })(),
    ).rejects.toThrow(/removed by retention/);
    // The CLI (the built package) says so too, as bad input.
    const cli = await flujo(['status', run.runId]);
    expect(cli.out).toMatch(/was removed by retention/);
    expect(cli.code).toBe(2);
    // A run that never existed is not "removed".
    const unknown = runtime.status('never-there');
    await expect(unknown).rejects.toBeInstanceOf(RunNotFoundError);
    await expect(runtime.status('never-there')).rejects.not.toBeInstanceOf(RunRemovedError);

    // The tenant's reservation records (one HASH for every run) go with the next expiry in it.
    const tenantRecords = runtimeCore(runtime).stores.keys.reservations('default');
    expect(await redis.hmget(tenantRecords, ...records)).not.toContain(null);
    scriptAgent();
    const next = await runtime.start(agentPlan(), 'Go.');
    expect((await next.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await until(
      async () => (await redis.exists(runtimeCore(runtime).stores.keys.removed(next.runId))) === 1,
    );
    expect(await redis.hmget(tenantRecords, ...records)).toEqual([null, null]);
    expect(await redis.hlen(tenantRecords)).toBe(2);
  });

  it('a run waiting for a person keeps every key, and gets the expiry once it finishes', async () => {
    await startWorker();
    scriptAgent();
    const run = await runtime.start(agentPlan(true), 'Go.');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('waiting');
    await new Promise((ok) => setTimeout(ok, RETENTION_MS + 200));
    const keys = await keysOf(run.runId);
    expect(keys.length).toBeGreaterThan(8);
    // No key of a waiting run has an expiry, blobs included: they go with their run.
    for (const [key, ttl] of Object.entries(await ttls(keys))) {
      expect([key, ttl]).toEqual([key, -1]);
    }
    expect(keys).not.toContain(runtimeCore(runtime).stores.keys.removed(run.runId));

    await runtime.approve(run.runId, 'after', { by: 'ana' });
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await until(
      async () => (await redis.exists(runtimeCore(runtime).stores.keys.removed(run.runId))) === 1,
    );
    const after = await ttls(await keysOf(run.runId));
    expect(Object.values(after).every((ttl) => ttl > 0)).toBe(true);
  });

  /** Fails the run (its last step) and waits until the worker that failed it is done with it. */
  async function failedRun(): Promise<{ runId: string; settled: () => Promise<string> }> {
    scriptAgent();
    failFirst.add('after');
    const run = await runtime.start(agentPlan(), 'Go.');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('failed');
    // It leaves the active runs (after its expiry, if it gets one), as a finished run does.
    await until(
      async () =>
        (await redis.sismember(runtimeCore(runtime).stores.keys.activeRuns(), run.runId)) === 0,
    );
    return {
      runId: run.runId,
      settled: async () => (await run.settled({ timeoutMs: 10_000 })).status,
    };
  }

  it('a failed run keeps every key by default and stays listed; resumed, it gets the expiry once it succeeds', async () => {
    const first = await startWorker();
    const run = await failedRun();
    const { keys } = runtimeCore(runtime).stores;
    // No worker while the keys are looked at: nothing else happens to the run meanwhile.
    await first.close();
    const failed = await ttls(await keysOf(run.runId));
    expect(Object.keys(failed).length).toBeGreaterThan(8);
    expect(failed).not.toHaveProperty(keys.removed(run.runId).slice(prefix.length));
    // No key has an expiry, blobs included: they go with their run.
    for (const [key, ttl] of Object.entries(failed)) expect([key, ttl]).toEqual([key, -1]);
    expect(await redis.pttl(keys.runUsage('default', run.runId))).toBe(-1);
    expect((await runtime.list()).map((r) => [r.runId, r.status])).toEqual([[run.runId, 'failed']]);
    // Still listed as active (a worker died right after the commit that failed it): a worker start
    // takes it off the active runs, and gives it no expiry either.
    await redis.sadd(keys.activeRuns(), run.runId);
    await startWorker();
    expect(await redis.sismember(keys.activeRuns(), run.runId)).toBe(0);
    expect(await redis.pttl(keys.snap(run.runId))).toBe(-1);
    expect(await redis.exists(keys.removed(run.runId))).toBe(0);
    await workers.pop()!.close();

    await runtime.resume(run.runId, { by: 'ana' });
    const kept = await ttls(await keysOf(run.runId));
    expect(kept).not.toHaveProperty(keys.removed(run.runId).slice(prefix.length));
    // No key has an expiry, blobs included.
    for (const [key, ttl] of Object.entries(kept)) expect([key, ttl]).toEqual([key, -1]);
    await startWorker();
    expect(await run.settled()).toBe('succeeded');
    await until(async () => (await redis.exists(keys.removed(run.runId))) === 1);
    // The expiry of finished runs, on every key.
    const finished = await ttls(await keysOf(run.runId));
    for (const [key, ttl] of Object.entries(finished)) {
      if (key.endsWith(':removed')) expect(ttl).toBeGreaterThan(RETENTION_MS);
      else expect([key, ttl > 0 && ttl <= RETENTION_MS]).toEqual([key, true]);
    }
  });

  it('a failed run that is cancelled ends cancelled and gets the expiry of finished runs', async () => {
    const first = await startWorker();
    const run = await failedRun();
    const { keys } = runtimeCore(runtime).stores;
    expect(await redis.pttl(keys.snap(run.runId))).toBe(-1);
    const report = await runtime.cancel(run.runId, { by: 'ana', reason: 'not needed' });
    expect(report.status).toBe('cancelled');
    await first.close();
    await until(async () => (await redis.exists(keys.removed(run.runId))) === 1);
    const cancelled = await ttls(await keysOf(run.runId));
    expect(Object.keys(cancelled).length).toBeGreaterThan(8);
    for (const [key, ttl] of Object.entries(cancelled)) {
      if (key.endsWith(':removed')) expect(ttl).toBeGreaterThan(RETENTION_MS);
      else expect([key, ttl > 0 && ttl <= RETENTION_MS]).toEqual([key, true]);
    }
    expect((await runtime.list()).map((r) => [r.runId, r.status])).toEqual([
      [run.runId, 'cancelled'],
    ]);
    // A second cancel changes nothing.
    const version = await redis.hget(keys.snap(run.runId), 'v');
    expect((await runtime.cancel(run.runId, { by: 'bo' })).status).toBe('cancelled');
    expect(await redis.hget(keys.snap(run.runId), 'v')).toBe(version);
  });

  it('with failedRunsMs, a failed run gets that expiry; resumed and cancelled, it gets that of finished runs', async () => {
    const FAILED_MS = 60_000;
    await restart({ finishedRunsMs: RETENTION_MS, failedRunsMs: FAILED_MS });
    const first = await startWorker();
    const run = await failedRun();
    const { keys } = runtimeCore(runtime).stores;
    await first.close();
    const failed = await ttls(await keysOf(run.runId));
    expect(Object.keys(failed).length).toBeGreaterThan(8);
    for (const [key, ttl] of Object.entries(failed)) {
      if (key.endsWith(':removed')) expect(ttl).toBeGreaterThan(FAILED_MS);
      else expect([key, ttl > RETENTION_MS && ttl <= FAILED_MS]).toEqual([key, true]);
    }
    expect(JSON.parse((await redis.get(keys.removed(run.runId)))!)).toMatchObject({
      retentionMs: FAILED_MS,
      failed: true,
    });
    expect((await runtime.list()).map((r) => r.runId)).toEqual([run.runId]);

    // Resumed (no worker: it goes on no further), it keeps its keys again.
    await runtime.resume(run.runId, { by: 'ana' });
    expect(await redis.pttl(keys.snap(run.runId))).toBe(-1);
    expect(await redis.exists(keys.removed(run.runId))).toBe(0);
    // As if the resume had died before it took the expiry back: the failed run's tombstone is left.
    await redis.set(
      keys.removed(run.runId),
      JSON.stringify({ finishedAt: Date.now(), retentionMs: FAILED_MS, failed: true }),
    );
    expect((await runtime.cancel(run.runId, { by: 'ana' })).status).toBe('cancelled');
    await until(
      async () =>
        !(JSON.parse((await redis.get(keys.removed(run.runId))) ?? '{}') as { failed?: boolean })
          .failed,
    );
    const cancelled = await ttls(await keysOf(run.runId));
    for (const [key, ttl] of Object.entries(cancelled)) {
      if (key.endsWith(':removed')) expect(ttl).toBeGreaterThan(RETENTION_MS);
      else expect([key, ttl > 0 && ttl <= RETENTION_MS]).toEqual([key, true]);
    }
    expect(JSON.parse((await redis.get(keys.removed(run.runId)))!)).toMatchObject({
      retentionMs: RETENTION_MS,
      failed: false,
    });
  });

  it('a failed run removed by failedRunsMs is reported as such, and leaves the run list', async () => {
    await restart({ finishedRunsMs: RETENTION_MS, failedRunsMs: 500 });
    await startWorker();
    const run = await failedRun();
    const { keys } = runtimeCore(runtime).stores;
    await until(async () => (await redis.exists(keys.snap(run.runId))) === 0);
    const status = runtime.status(run.runId);
    await expect(status).rejects.toBeInstanceOf(RunRemovedError);
    await expect(runtime.status(run.runId)).rejects.toThrow(
      /it failed at .* failed runs are kept 500 ms \(retention\.failedRunsMs\)/,
    );
    await expect(runtime.status(run.runId)).rejects.toMatchObject({ failed: true });
    expect(await runtime.list()).toEqual([]);
    expect(await redis.zscore(keys.runIndex(), run.runId)).toBeNull();
  });

  it('a worker that died between the final commit and the expiry: the next worker start heals it', async () => {
    const first = await startWorker();
    scriptAgent();
    const run = await runtime.start(agentPlan(), 'Go.');
    expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
    await first.close();
    // The state a crash right after the final commit leaves: no expiry, still listed as active.
    for (const key of await keysOf(run.runId)) await redis.persist(key);
    await redis.del(runtimeCore(runtime).stores.keys.removed(run.runId));
    await redis.sadd(runtimeCore(runtime).stores.keys.activeRuns(), run.runId);

    await startWorker();
    const healed = await ttls(await keysOf(run.runId));
    expect(Object.values(healed).every((ttl) => ttl > 0)).toBe(true);
    expect(healed).toHaveProperty(
      runtimeCore(runtime).stores.keys.removed(run.runId).slice(prefix.length),
    );
    expect(await redis.sismember(runtimeCore(runtime).stores.keys.activeRuns(), run.runId)).toBe(0);
  });

  it('refuses a retention that is not a positive number of ms, naming the field, before connecting', async () => {
    const refused = (retention: unknown): InputValidationError => {
      let error: unknown;
      try {
        createRuntime({ redis: redisUrl(), prefix, retention: retention as never });
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(InputValidationError);
      expect((error as Error).message).toMatch(/retention/);
      return error as InputValidationError;
    };
    const paths = (error: InputValidationError) => error.issues.map((i) => i.path);
    for (const retention of [{ finishedRunsMs: -1 }, { finishedRunsMs: 'week' }]) {
      expect(paths(refused(retention))).toEqual(['retention.finishedRunsMs']);
    }
    for (const retention of [7, null]) expect(paths(refused(retention))).toEqual(['retention']);
    for (const failedRunsMs of [0, -5, 'month', null, Infinity, Number.NaN]) {
      const error = refused({ finishedRunsMs: RETENTION_MS, failedRunsMs });
      expect(paths(error)).toEqual(['retention.failedRunsMs']);
      // The fix is named: a number of ms, or leaving it out.
      expect(error.message).toMatch(/retention\.failedRunsMs.*milliseconds.*left out/);
    }
    expect(paths(refused({ finishedRunsMs: 0, failedRunsMs: 'month' }))).toEqual([
      'retention.finishedRunsMs',
      'retention.failedRunsMs',
    ]);
    // Accepted: absent (kept), or a number of ms.
    for (const retention of [{ failedRunsMs: 1 }, { finishedRunsMs: 1000, failedRunsMs: 2.5 }]) {
      await createRuntime({ redis: redisUrl(), prefix, retention }).close();
    }
    expect(runtimeCore(runtime).stores.retention.failedRunsMs).toBeNull();
    // Queue job records are bounded by age as well as by count.
    expect(runtimeCore(runtime).queues.queue.defaultJobOptions.removeOnComplete).toMatchObject({
      age: expect.any(Number) as number,
    });
  });
});
