/**
 * The end of a run in two round trips: once the commit that ends a run returns, its keys get their
 * expiry (the run's own, its tenant's, its request key), its reservation records are queued, it
 * leaves the active runs and is noted among the runs that ended lately, its end is noted in the
 * run list, and its open reservations are read, in at most two round trips on the worker's
 * connection. Counted on the connection itself: a round trip is a stretch from a command sent
 * while none was outstanding to the reply that leaves none outstanding. Also: doing it again
 * changes nothing, and a crash between the two round trips is healed by the sweep of the runs
 * that ended. On one server (the count is about the connection, not about slots).
 */
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  createRuntime,
  defineAgent,
  defineTool,
  type FlujoWorker,
  type PlanInput,
  type Runtime,
} from '../../src/index.js';
import { startScriptedModelServer, type ScriptedModelServer } from '../../src/testing/index.js';
import { connect, deleteRuntimeKeys, redisUrl, scanKeys, testPrefix } from '../helpers/redis.js';
import { runtimeCore } from '../../src/runtime.js';
import { reconcileEnded } from '../../src/worker/reconcile.js';
import { countTrips } from '../helpers/round-trips.js';

const RETENTION_MS = 60 * 60 * 1000;

let model: ScriptedModelServer;
let redis: Redis;
let prefix: string;
let runner: Runtime;
let client: Runtime;
let worker: FlujoWorker | undefined;

const fetchPage = defineTool({
  name: 'fetch_page',
  input: z.object({ url: z.string() }),
  idempotent: true,
  // Over the blob threshold: the result is stored as a blob of the run.
  run: ({ url }) => ({ url, body: `<p>${'y'.repeat(30_000)}</p>` }),
});

const plan: PlanInput = {
  name: 'ends',
  steps: [
    { id: 'research', kind: 'agent', agent: 'researcher', mode: 'granular' },
    { id: 'after', kind: 'operator', operator: 'after', dependsOn: ['research'] },
  ],
};

function runtimeOf(endedRunsCheckMs?: number): Runtime {
  const agent = defineAgent({
    name: 'researcher',
    model: 'gpt-4o-mini',
    provider: { baseURL: model.url, apiKey: 'test-key' },
    systemPrompt: 'Research, then answer.',
    tools: [fetchPage],
    settings: { maxTokens: 100 },
    timeoutMs: 5000,
  });
  return createRuntime({
    redis: redisUrl(),
    prefix,
    retention: { finishedRunsMs: RETENTION_MS },
    ...(endedRunsCheckMs === undefined ? {} : { endedRunsCheckMs }),
    pricing: { models: { 'gpt-4o-mini': { inputPerMillion: 0.15, outputPerMillion: 0.6 } } },
  })
    .agent(agent)
    .operator('after', ({ stepId }) => ({ done: stepId }));
}

function scriptAgent(): void {
  model.enqueue(
    { toolCalls: [{ id: 'c1', name: 'fetch_page', arguments: { url: 'https://a.example' } }] },
    { text: 'Done.', usage: { prompt_tokens: 100, completion_tokens: 5 } },
  );
}

/** Runs the plan to its end, counting the round trips of the worker's `meta.ended`. */
async function countedRun(
  requestKey: string,
): Promise<{ runId: string; trips: number; commands: string[]; ends: number }> {
  const core = runtimeCore(runner);
  let inEnd = 0;
  let ends = 0;
  const counts = countTrips(core.redis, () => inEnd > 0);
  const ended = core.meta.ended.bind(core.meta);
  core.meta.ended = async (runId, status) => {
    inEnd++;
    ends++;
    try {
      await ended(runId, status);
    } finally {
      inEnd--;
    }
  };
  worker = runner.createWorker({ concurrency: 1, sweepEveryMs: 0 });
  await worker.ready();
  scriptAgent();
  const run = await client.start(plan, { topic: 'x' }, { requestKey });
  expect((await run.settled({ timeoutMs: 20_000 })).status).toBe('succeeded');
  // The end follows the final commit in the same job: wait for the job to finish.
  await worker.close();
  worker = undefined;
  return { runId: run.runId, trips: counts.trips, commands: counts.commands, ends };
}

/** Every key of the run (its hash tag, its tenant's keys of it, its request key) and its TTL. */
async function ttlsOf(runId: string, requestKey: string): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const key of await scanKeys(redis, `${prefix}*`)) {
    if (key.includes(`{${runId}}`) || key.endsWith(`:${runId}`) || key.endsWith(requestKey)) {
      out.set(key, await redis.pttl(key));
    }
  }
  return out;
}

beforeAll(async () => {
  model = await startScriptedModelServer();
  redis = connect();
});

afterAll(async () => {
  redis.disconnect();
  await model.close();
});

beforeEach(() => {
  prefix = testPrefix();
});

afterEach(async () => {
  await worker?.close();
  worker = undefined;
  await runner.close();
  await client.close();
  await deleteRuntimeKeys(prefix);
});

describe("a run's end", () => {
  it('takes at most two round trips, and leaves every key with its expiry', async () => {
    runner = runtimeOf();
    client = runtimeOf();
    const requestKey = `req-${randomUUID()}`;
    const { runId, trips, commands, ends } = await countedRun(requestKey);
    expect(ends).toBeGreaterThanOrEqual(1);
    // Once per end (a later guard of the same end would come here again).
    expect(trips / ends).toBeLessThanOrEqual(2);
    expect(commands.length).toBeGreaterThan(0);
    const keys = runtimeCore(runner).stores.keys;
    const ttls = await ttlsOf(runId, requestKey);
    // The run's keys, its usage and reservations in its tenant's slot, its request key.
    expect(ttls.has(keys.snap(runId))).toBe(true);
    expect(ttls.has(keys.runUsage('default', runId))).toBe(true);
    expect(ttls.has(keys.requestKey('default', requestKey))).toBe(true);
    expect([...ttls.keys()].some((k) => k.includes(':blob:'))).toBe(true);
    for (const [key, ttl] of ttls) {
      if (key === keys.removed(runId)) continue;
      expect({ key, expires: ttl > 0 && ttl <= RETENTION_MS }).toEqual({ key, expires: true });
    }
    expect(await redis.pttl(keys.removed(runId))).toBeGreaterThan(RETENTION_MS);
    expect(await redis.sismember(keys.activeRuns(), runId)).toBe(0);
    expect(await redis.zscore(keys.endedRuns(), runId)).not.toBeNull();
    expect(await redis.hget(keys.runInfo(), `${runId}\nend`)).toMatch(/^succeeded \d+$/);
    // Its reservation records are queued for when its keys expire.
    const queued = await redis.zrange(
      keys.expiringReservations('default'),
      '0',
      '-1',
      'WITHSCORES',
    );
    expect(queued).toHaveLength(2);
    const member = JSON.parse(queued[0]!) as { runId: string; ids: string[] };
    expect(member.runId).toBe(runId);
    expect(member.ids.length).toBeGreaterThan(0);
    expect(Number(queued[1])).toBeGreaterThan(Date.now() + RETENTION_MS - 60_000);
  }, 60_000);

  it('done again, changes no expiry and queues nothing twice, in two round trips', async () => {
    runner = runtimeOf();
    client = runtimeOf();
    const requestKey = `req-${randomUUID()}`;
    const { runId } = await countedRun(requestKey);
    const keys = runtimeCore(runner).stores.keys;
    const end = await redis.hget(keys.runInfo(), `${runId}\nend`);
    const before = await ttlsOf(runId, requestKey);
    await new Promise((ok) => setTimeout(ok, 50));
    const core = runtimeCore(runner);
    // The meta leaves the cache once the run ended: a process without it reads it first.
    await core.meta.read(runId);
    let counting = true;
    const counts = countTrips(core.redis, () => counting);
    await core.meta.ended(runId, 'succeeded');
    counting = false;
    expect(counts.trips).toBeLessThanOrEqual(2);
    const after = await ttlsOf(runId, requestKey);
    expect([...after.keys()].sort()).toEqual([...before.keys()].sort());
    // Not set again: each TTL only went down.
    for (const [key, ttl] of after) expect(ttl).toBeLessThanOrEqual(before.get(key)!);
    expect(await redis.hget(keys.runInfo(), `${runId}\nend`)).toBe(end);
    expect(await redis.zcard(keys.expiringReservations('default'))).toBe(1);
  }, 60_000);

  it('a crash between the two round trips (noted as ended, no expiry yet) is healed by the sweep', async () => {
    runner = runtimeOf();
    client = runtimeOf();
    const requestKey = `req-${randomUUID()}`;
    const { runId } = await countedRun(requestKey);
    const keys = runtimeCore(runner).stores.keys;
    // As if the second round trip's expiry of the run's own keys was lost: no tombstone, no TTL.
    const snapshotKeys = [...(await ttlsOf(runId, requestKey)).keys()].filter((k) =>
      k.includes(`{${runId}}`),
    );
    await redis.del(keys.removed(runId));
    for (const key of snapshotKeys) await redis.persist(key);
    expect(await redis.pttl(keys.snap(runId))).toBe(-1);
    expect(await redis.sismember(keys.activeRuns(), runId)).toBe(0);
    await reconcileEnded(runtimeCore(runner), new AbortController().signal);
    const ttl = await redis.pttl(keys.snap(runId));
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(RETENTION_MS);
    expect(await redis.exists(keys.removed(runId))).toBe(1);
    expect(await redis.sismember(keys.activeRuns(), runId)).toBe(0);
  }, 60_000);

  it('without the check of runs that ended, it leaves the active runs after its expiry (three round trips)', async () => {
    runner = runtimeOf(0);
    client = runtimeOf(0);
    const requestKey = `req-${randomUUID()}`;
    const { runId, trips, ends } = await countedRun(requestKey);
    expect(trips / ends).toBeLessThanOrEqual(3);
    const keys = runtimeCore(runner).stores.keys;
    expect(await redis.pttl(keys.snap(runId))).toBeGreaterThan(0);
    expect(await redis.sismember(keys.activeRuns(), runId)).toBe(0);
    expect(await redis.zscore(keys.endedRuns(), runId)).toBeNull();
  }, 60_000);
});
