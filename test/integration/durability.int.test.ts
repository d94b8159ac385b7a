/**
 * `durability: { replicas, timeoutMs }`: every write the runtime acts on is acknowledged by that
 * many replicas first. On a master with one replica: a run's commits are each followed by a
 * `WAIT` (counted at the server); with the replica cut off, the run does not go past the step in
 * flight (that step's effect ran once, its commit is on the master, nothing after it runs), and
 * once the replica is back the run finishes with every step run once; asking for more replicas
 * than there are fails a start with a retryable `ReplicasBehindError`; bad options are refused.
 */
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InputValidationError, ReplicasBehindError } from '../../src/errors.js';
import type { PlanInput } from '../../src/plan/schema.js';
import { createRuntime, type Runtime } from '../../src/runtime.js';
import { caught } from '../helpers/caught.js';
import { startRedisServer, type TestRedisServer } from '../helpers/redis-server.js';
import { testPrefix } from '../helpers/redis.js';

let master: TestRedisServer;
let replica: TestRedisServer;
let admin: Redis;
let replicaAdmin: Redis;

const chain = (n: number): PlanInput => ({
  name: `chain-${n}`,
  steps: Array.from({ length: n }, (_, i) => ({
    id: `s${i}`,
    kind: 'operator' as const,
    operator: 'count',
    ...(i === 0 ? {} : { dependsOn: [`s${i - 1}`] }),
  })),
});

/** How many WAIT commands the master has served. */
async function waits(): Promise<number> {
  const info = await admin.info('commandstats');
  const match = /cmdstat_wait:calls=(\d+)/.exec(info);
  return match === null ? 0 : Number(match[1]);
}

/** Resolves once the master counts `n` connected replicas. */
async function replicasConnected(n: number): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const info = await admin.info('replication');
    if (new RegExp(`connected_slaves:${n}\\b`).test(info) && (n === 0 || /state=online/.test(info)))
      return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`the master never had ${n} replica(s)`);
}

beforeAll(async () => {
  master = await startRedisServer();
  replica = await startRedisServer(['--replicaof', '127.0.0.1', String(master.port)]);
  admin = new Redis(master.url, { maxRetriesPerRequest: 1 });
  replicaAdmin = new Redis(replica.url, { maxRetriesPerRequest: 1 });
  await replicasConnected(1);
}, 30_000);

afterAll(async () => {
  admin?.disconnect();
  replicaAdmin?.disconnect();
  await replica?.stop();
  await master?.stop();
});

/** A runtime on the master whose `count` operator counts its calls per run and step. */
function counting(options: { replicas: number; timeoutMs?: number }) {
  const calls = new Map<string, number>();
  const runtime = createRuntime({
    redis: master.url,
    prefix: testPrefix(),
    durability: options,
  }).operator('count', ({ runId, stepId }) => {
    const key = `${runId}/${stepId}`;
    calls.set(key, (calls.get(key) ?? 0) + 1);
    return stepId;
  });
  return { runtime, calls };
}

describe('durability: replicas acknowledge before the runtime acts', () => {
  let runtime: Runtime;
  let calls: Map<string, number>;

  beforeAll(() => {
    ({ runtime, calls } = counting({ replicas: 1, timeoutMs: 100 }));
  });
  afterAll(async () => {
    await runtime.close();
  });

  it('waits for the replica after every commit of a run', async () => {
    const worker = runtime.createWorker();
    try {
      await worker.ready();
      const before = await waits();
      const handle = await runtime.start(chain(5), null, { runId: 'acked' });
      const report = await handle.settled({ timeoutMs: 10_000 });
      expect(report.status).toBe('succeeded');
      // At least the run's creation and one per step commit (concurrent waits may share one).
      expect((await waits()) - before).toBeGreaterThanOrEqual(6);
      expect([...calls.entries()].filter(([k]) => k.startsWith('acked/'))).toHaveLength(5);
      // What the API showed as committed is on the replica.
      const keys = await replicaAdmin.keys('*{*acked}:snap');
      expect(keys).toHaveLength(1);
    } finally {
      await worker.close();
    }
  });

  it('goes no further than the step in flight while the replica is cut off, then finishes', async () => {
    const worker = runtime.createWorker({ concurrency: 4 });
    try {
      await worker.ready();
      await replicaAdmin.replicaof('NO', 'ONE');
      await replicasConnected(0);
      const handle = await caught(runtime.start(chain(4), null, { runId: 'cut-off' }));
      // Nothing acknowledges the run's creation: the start fails, retryable, and nothing ran.
      expect(handle).toBeInstanceOf(ReplicasBehindError);
      expect((handle as ReplicasBehindError).retryable).toBe(true);
      expect((handle as ReplicasBehindError).code).toBe('redis_unavailable');
      await new Promise((r) => setTimeout(r, 500));
      expect(calls.get('cut-off/s0')).toBeUndefined();

      await replicaAdmin.replicaof('127.0.0.1', String(master.port));
      await replicasConnected(1);
      // The same start again goes through (whether the first one got as far as the creation).
      // Retryable: a replica that just came back may need a moment before it acknowledges.
      let again: Awaited<ReturnType<Runtime['start']>> | undefined;
      for (let i = 0; again === undefined; i++) {
        try {
          again = await runtime.start(chain(4), null, { runId: 'cut-off' });
        } catch (error) {
          if (!(error instanceof ReplicasBehindError) || i >= 20) throw error;
          await new Promise((r) => setTimeout(r, 200));
        }
      }
      expect((await again.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
      expect(['s0', 's1', 's2', 's3'].map((s) => calls.get(`cut-off/${s}`))).toEqual([1, 1, 1, 1]);
    } finally {
      await worker.close();
    }
  });

  it('holds the next unit back while a step commit is not acknowledged', async () => {
    let cut = false;
    const slow = createRuntime({
      redis: master.url,
      prefix: testPrefix(),
      durability: { replicas: 1, timeoutMs: 100 },
    });
    const ran: string[] = [];
    slow.operator('count', async ({ stepId }) => {
      ran.push(stepId);
      if (stepId === 's1') {
        // The replica goes away while s1 runs: its commit is not acknowledged.
        await replicaAdmin.replicaof('NO', 'ONE');
        await replicasConnected(0);
        cut = true;
      }
      return stepId;
    });
    const slowWorker = slow.createWorker({ concurrency: 2 });
    try {
      await slowWorker.ready();
      const handle = await slow.start(chain(4), null, { runId: 'held' });
      for (let i = 0; i < 100 && !cut; i++) await new Promise((r) => setTimeout(r, 50));
      expect(cut).toBe(true);
      await new Promise((r) => setTimeout(r, 1500));
      // s1's commit is on the master but not on the replica: s2 has not run.
      expect(ran).toEqual(['s0', 's1']);
      await replicaAdmin.replicaof('127.0.0.1', String(master.port));
      await replicasConnected(1);
      expect((await handle.settled({ timeoutMs: 20_000 })).status).toBe('succeeded');
      expect(ran).toEqual(['s0', 's1', 's2', 's3']);
    } finally {
      await replicaAdmin.replicaof('127.0.0.1', String(master.port));
      await replicasConnected(1);
      await slowWorker.close();
      await slow.close();
    }
  });
});

describe('durability: what it refuses', () => {
  it('fails a start with ReplicasBehindError when fewer replicas exist than asked', async () => {
    const { runtime } = counting({ replicas: 2, timeoutMs: 50 });
    try {
      const error = await caught(runtime.start(chain(1), null));
      expect(error).toBeInstanceOf(ReplicasBehindError);
      expect((error as ReplicasBehindError).toJSON().details).toMatchObject({
        wanted: 2,
        acknowledged: 1,
        timeoutMs: 50,
      });
      expect((error as Error).message).toMatch(/1 of 2 replica\(s\) acknowledged/);
    } finally {
      await runtime.close();
    }
  });

  it('refuses options that are not a replica count and a timeout, naming the field', () => {
    const cases: [unknown, string][] = [
      [{ replicas: -1 }, 'durability.replicas'],
      [{ replicas: 1.5 }, 'durability.replicas'],
      [{ replicas: '1' }, 'durability.replicas'],
      [{ replicas: 1, timeoutMs: 0 }, 'durability.timeoutMs'],
      [{ replicas: 1, timeoutMs: 'soon' }, 'durability.timeoutMs'],
      [{ replicas: 1, wait: true }, 'durability.wait'],
      [1, 'durability'],
    ];
    for (const [durability, path] of cases) {
      const error = (() => {
        try {
          createRuntime({ redis: master.url, durability: durability as { replicas: number } });
        } catch (e) {
          return e;
        }
        return undefined;
      })();
      expect(error, JSON.stringify(durability)).toBeInstanceOf(InputValidationError);
      expect((error as InputValidationError).issues[0]!.path).toBe(path);
    }
  });
});
