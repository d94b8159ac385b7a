import { Cluster, Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, type Runtime } from '../../src/index.js';
import type { Logger } from '../../src/logging.js';
import { startRedisCluster, type TestRedisCluster } from '../helpers/redis-cluster.js';
import { testPrefix } from '../helpers/redis.js';

/** Every error a node connection was answered with, and every logged line: checked for CROSSSLOT. */
const seen: string[] = [];
const logger: Logger = {
  debug: () => {},
  info: () => {},
  warn: (fields, message) => seen.push(`${message} ${JSON.stringify(fields)}`),
  error: (fields, message) => seen.push(`${message} ${JSON.stringify(fields)}`),
};

type Send = (this: Redis, command: { promise: Promise<unknown> }, ...rest: unknown[]) => unknown;
const proto = Redis.prototype as unknown as { sendCommand: Send };
const send = proto.sendCommand;

let cluster: TestRedisCluster;
let client: Cluster;

beforeAll(async () => {
  proto.sendCommand = function (this: Redis, command, ...rest) {
    command.promise.catch((e: unknown) => seen.push(String(e)));
    return send.call(this, command, ...rest);
  };
  cluster = await startRedisCluster();
  client = new Cluster(cluster.seeds, { redisOptions: { maxRetriesPerRequest: 1 } });
}, 60_000);

afterAll(async () => {
  proto.sendCommand = send;
  client?.disconnect();
  await cluster?.stop();
});

const chain = (n: number, operator = 'step') =>
  Array.from({ length: n }, (_, i) => ({
    id: `s${i}`,
    kind: 'operator' as const,
    operator,
    dependsOn: i === 0 ? [] : [`s${i - 1}`],
  }));

/** The slots of every key of the run under `prefix:{runId}:`, over every master. */
async function runKeySlots(prefix: string, runId: string): Promise<Map<string, number>> {
  const slots = new Map<string, number>();
  for (const node of client.nodes('master')) {
    let cursor = '0';
    do {
      const [next, keys] = await node.scan(cursor, 'MATCH', `${prefix}:{${runId}}:*`, 'COUNT', 500);
      cursor = next;
      for (const key of keys) slots.set(key, Number(await client.cluster('KEYSLOT', key)));
    } while (cursor !== '0');
  }
  return slots;
}

describe('the runtime on a Redis Cluster (3 masters, 3 replicas)', () => {
  it('takes a Cluster as its redis (no cast); a worker started with pending work runs it', async () => {
    const prefix = testPrefix();
    const starter: Runtime = createRuntime({ redis: client, prefix, logger });
    const runs = await Promise.all(
      Array.from({ length: 6 }, (_, i) =>
        starter.start({ name: `pending-${i}`, steps: chain(3) }, { i }),
      ),
    );
    // A Cluster whose own options bound retries: every duplicate the runtime makes keeps the
    // options it needs (BullMQ's `maxRetriesPerRequest: null`).
    const rt = createRuntime({ redis: client, prefix, logger });
    rt.operator('step', ({ input, stepId, progress }) => {
      progress({ stepId });
      return { input };
    });
    const worker = rt.createWorker({ concurrency: 4 });
    await worker.ready();
    try {
      for (const run of runs) {
        const done = await run.settled({ timeoutMs: 20_000 });
        expect(done.status).toBe('succeeded');
      }
      // Progress is recorded and published in one MULTI (a hash of the run and its channel).
      const progress = await client.hgetall(`${prefix}:{${runs[0]!.runId}}:progress`);
      expect(Object.keys(progress).sort()).toEqual(['s0', 's1', 's2']);
    } finally {
      await worker.close();
      await rt.close();
      await starter.close();
    }
  });

  it('a fan-out of 60 leaves completes, each operator invoked once', async () => {
    const prefix = testPrefix();
    const rt = createRuntime({ redis: cluster.url, prefix, logger });
    const calls = new Map<string, number>();
    rt.operator('count', ({ stepId }) => {
      calls.set(stepId, (calls.get(stepId) ?? 0) + 1);
      return { stepId };
    });
    const leaves = Array.from({ length: 60 }, (_, i) => ({
      id: `leaf${i}`,
      kind: 'operator' as const,
      operator: 'count',
      dependsOn: ['root'],
    }));
    const worker = rt.createWorker({ concurrency: 8 });
    await worker.ready();
    try {
      const run = await rt.start(
        {
          name: 'fan-out',
          steps: [
            { id: 'root', kind: 'operator', operator: 'count' },
            ...leaves,
            {
              id: 'join',
              kind: 'operator',
              operator: 'count',
              dependsOn: leaves.map((l) => l.id),
            },
          ],
        },
        null,
      );
      const done = await run.settled({ timeoutMs: 30_000 });
      expect(done.status).toBe('succeeded');
      expect(calls.size).toBe(62);
      expect([...calls.values()].every((n) => n === 1)).toBe(true);

      // Every key of the finished run is in one slot, the slot of its hash tag.
      const slots = await runKeySlots(prefix, run.runId);
      expect(slots.size).toBeGreaterThan(3);
      expect(new Set(slots.values()).size).toBe(1);
    } finally {
      await worker.close();
      await rt.close();
    }
  });

  it('20 runs started at once, settled() on all of them at once', async () => {
    const prefix = testPrefix();
    const rt = createRuntime({ redis: cluster.url, prefix, logger });
    rt.operator('step', ({ input }) => ({ input }));
    const worker = rt.createWorker({ concurrency: 8 });
    await worker.ready();
    try {
      const runs = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          rt.start({ name: `many-${i}`, steps: chain(3) }, { i }),
        ),
      );
      // The runs are spread over the masters: the waits read several slots on several nodes.
      const slots = new Set(
        await Promise.all(
          runs.map(async (r) => Number(await client.cluster('KEYSLOT', `{${r.runId}}`))),
        ),
      );
      expect(slots.size).toBeGreaterThan(10);
      const done = await Promise.all(runs.map((r) => r.settled({ timeoutMs: 30_000 })));
      expect(done.map((d) => d.status)).toEqual(runs.map(() => 'succeeded'));
      const listed = await rt.list({ limit: 50 });
      expect(listed.length).toBe(20);
    } finally {
      await worker.close();
      await rt.close();
    }
  });

  it('runs of several tenants with request keys finish: their request keys and usage get their expiry', async () => {
    const prefix = testPrefix();
    const rt = createRuntime({ redis: cluster.url, prefix, logger });
    rt.operator('step', ({ input }) => ({ input }));
    const worker = rt.createWorker({ concurrency: 8 });
    await worker.ready();
    try {
      const starts = Array.from({ length: 12 }, (_, i) => ({
        tenantId: `tenant-${i % 4}`,
        requestKey: `order-${i}`,
      }));
      const runs = await Promise.all(
        starts.map((o, i) => rt.start({ name: `keyed-${i}`, steps: chain(2) }, { i }, o)),
      );
      // A repeated request leads to the same run.
      const again = await rt.start({ name: 'keyed-0', steps: chain(2) }, { i: 0 }, starts[0]);
      expect(again.runId).toBe(runs[0]!.runId);
      const done = await Promise.all(runs.map((r) => r.settled({ timeoutMs: 30_000 })));
      expect(done.map((d) => d.status)).toEqual(runs.map(() => 'succeeded'));
      // Keys of other slots than the run's (its request key, its tenant's usage keys) get their
      // expiry as well, and the run leaves the active runs.
      const deadline = Date.now() + 10_000;
      for (;;) {
        const ttls = await Promise.all(
          starts.map((o) => client.pttl(`${prefix}:request:${o.tenantId}:${o.requestKey}`)),
        );
        const active = await client.scard(`${prefix}:active-runs`);
        if (ttls.every((t) => t > 0) && active === 0) break;
        if (Date.now() > deadline) {
          throw new Error(`request keys' ttls ${ttls.join(',')}, ${active} active runs left`);
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    } finally {
      await worker.close();
      await rt.close();
    }
  });

  it('a run whose slot went back after its end (its keys restored) is driven again from there', async () => {
    const prefix = testPrefix();
    const rt = createRuntime({ redis: client, prefix, logger });
    const calls = new Map<string, number>();
    let entered!: () => void;
    let release!: () => void;
    const inB = new Promise<void>((r) => (entered = r));
    const released = new Promise<void>((r) => (release = r));
    rt.operator('count', async ({ stepId }) => {
      const n = (calls.get(stepId) ?? 0) + 1;
      calls.set(stepId, n);
      if (stepId === 's1' && n === 1) {
        entered();
        await released;
      }
      return { n };
    });
    const runKeys = async () => [...(await runKeySlots(prefix, 'back')).keys()];
    const ended = `{${prefix}:active-runs}:ended`;
    expect(await client.cluster('KEYSLOT', ended)).toBe(
      await client.cluster('KEYSLOT', `${prefix}:active-runs`),
    );
    try {
      const worker = rt.createWorker({ sweepEveryMs: 0, chainMs: 0 });
      await worker.ready();
      const run = await rt.start({ name: 'back', steps: chain(3, 'count') }, null, {
        runId: 'back',
      });
      await inB;
      // The run's keys as a replica that lagged would have them: s0 committed, s1 running.
      const saved = new Map<string, Buffer>();
      for (const key of await runKeys()) saved.set(key, await client.dumpBuffer(key));
      release();
      expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
      const until = Date.now() + 10_000;
      while ((await client.zscore(ended, 'back')) === null && Date.now() < until) {
        await new Promise((r) => setTimeout(r, 50));
      }
      await worker.close();
      expect(await client.sismember(`${prefix}:active-runs`, 'back')).toBe(0);
      await client.del(...(await runKeys()));
      for (const [key, dump] of saved) await client.restore(key, 0, dump, 'REPLACE');
      expect((await run.status()).status).toBe('running');
      // One job per unit: s2's job is added again under the id of the job that ran it.
      const next = rt.createWorker({ sweepEveryMs: 0, chainMs: 0 });
      try {
        await next.ready();
        expect((await run.settled({ timeoutMs: 10_000 })).status).toBe('succeeded');
        expect(['s0', 's1', 's2'].map((s) => calls.get(s))).toEqual([1, 2, 2]);
      } finally {
        await next.close();
      }
    } finally {
      await rt.close();
    }
  });

  it('nothing was answered with CROSSSLOT or refused for keys of several slots', () => {
    const crossing = seen.filter((s) => /CROSSSLOT|same slot|slots allocation/i.test(s));
    expect(crossing).toEqual([]);
  });
});
