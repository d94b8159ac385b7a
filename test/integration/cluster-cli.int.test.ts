/**
 * The `flujo` binary (built into dist first) against a Redis Cluster given as a cluster URL: run,
 * status, list, ledger and resume answer for runs whatever master holds them; a `flujo worker`
 * waiting for a replica per write drives runs started through the API, and `flujo ledger resolve`
 * settles a call in doubt.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRuntime, parsePlan } from '../../src/index.js';
import { ledgerCallId } from '../../src/persistence/ledger.js';
import { runtimeCore } from '../../src/runtime.js';
import { runFlujo, startFlujo } from '../helpers/cli.js';
import { startRedisCluster, type TestRedisCluster } from '../helpers/redis-cluster.js';
import { testPrefix } from '../helpers/redis.js';

const JOB = 'test/fixtures/jobs/cluster-ledger.ts';
// The plan of JOB, started here through the API (the worker process has its operators).
const plan = parsePlan({
  name: 'cluster-ledger',
  defaults: { retry: { maxAttempts: 1 } },
  steps: [
    { id: 'pay', kind: 'operator', operator: 'pay', effects: ['external'] },
    { id: 'check', kind: 'operator', operator: 'check', dependsOn: ['pay'] },
  ],
});

let cluster: TestRedisCluster;
let client: Cluster;
let scratch: string;

beforeAll(async () => {
  cluster = await startRedisCluster();
  client = new Cluster(cluster.seeds);
  scratch = mkdtempSync(join(tmpdir(), 'flujo-cluster-cli-'));
}, 60_000);

afterAll(async () => {
  client?.disconnect();
  await cluster?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

/** How many WAIT commands the cluster's masters have served. */
async function waitsServed(): Promise<number> {
  let total = 0;
  for (const node of client.nodes('master')) {
    const match = /cmdstat_wait:calls=(\d+)/.exec(await node.info('commandstats'));
    total += match === null ? 0 : Number(match[1]);
  }
  return total;
}

describe('the flujo CLI on a Redis Cluster', { timeout: 90_000 }, () => {
  it('run, status, list, ledger and resume reach runs on every master', async () => {
    const prefix = testPrefix();
    const effects = join(scratch, 'effects');
    const env = { EFFECT_FILE: effects, MARKER_DIR: scratch };
    const flujo = (args: string[]) =>
      runFlujo([...args, '--redis', cluster.url], { prefix, redis: 'none', env, user: 'tester' });

    // Runs until they are held by at least two masters (each run id hashes to its own slot).
    const runIds: string[] = [];
    const masters = new Set<string>();
    while (runIds.length < 3 || (masters.size < 2 && runIds.length < 8)) {
      const run = await flujo(['run', JOB]);
      expect(run.code, run.err).toBe(1);
      const runId = /^run (\S+) /m.exec(run.out)![1]!;
      runIds.push(runId);
      const slot = Number(await client.cluster('KEYSLOT', `{${runId}}`));
      masters.add(client.slots[slot]![0]!);
    }
    expect(masters.size).toBeGreaterThanOrEqual(2);

    for (const runId of runIds) {
      const status = await flujo(['status', runId, '--json']);
      expect(status.code, status.err).toBe(1);
      const report = JSON.parse(status.out) as { status: string };
      expect(report.status).toBe('failed');

      const ledger = await flujo(['ledger', runId, '--json']);
      expect(ledger.code, ledger.err).toBe(0);
      const entries = JSON.parse(ledger.out) as { tool: string; state: string }[];
      expect(entries.map((e) => [e.tool, e.state])).toEqual([['transfer@1', 'SUCCEEDED']]);
    }

    const list = await flujo(['list', '--json']);
    expect(list.code, list.err).toBe(0);
    const listed = (JSON.parse(list.out) as { runId: string }[]).map((r) => r.runId).sort();
    expect(listed).toEqual([...runIds].sort());

    for (const runId of runIds) {
      const resumed = await flujo(['resume', runId, JOB]);
      expect(resumed.code, resumed.err).toBe(0);
      const status = await flujo(['status', runId, '--json']);
      expect((JSON.parse(status.out) as { status: string }).status).toBe('succeeded');
    }
    // One effect per run: the resumed runs did not call the tool again.
    expect(readFileSync(effects, 'utf8').trim().split('\n')).toEqual(runIds.map(() => '500'));
  });

  it('flujo worker --replicas 1 drives runs started elsewhere; ledger resolve settles a call in doubt', async () => {
    const prefix = testPrefix();
    const effects = join(scratch, 'worker-effects');
    const env = { EFFECT_FILE: effects, MARKER_DIR: scratch };
    const runtime = createRuntime({ redis: client, prefix });
    try {
      const runIds: string[] = [];
      for (let i = 0; i < 4; i++) runIds.push((await runtime.start(plan, null)).runId);
      // The first run's payment was started by a worker that died: in doubt, settled by a person.
      const [first] = runIds as [string];
      const args = { cents: 500 };
      const callId = ledgerCallId({
        tenantId: 'default',
        runId: first,
        stepId: 'pay',
        tool: 'transfer@1',
        args,
      });
      const { ledger } = runtimeCore(runtime).stores;
      await ledger.prepare({
        runId: first,
        stepId: 'pay',
        tenantId: 'default',
        callId,
        tool: 'transfer@1',
        args,
      });
      await ledger.markRunning(first, 'default', callId, 1);
      await new Promise((r) => setTimeout(r, 20));
      const resolved = await runFlujo(
        [
          'ledger',
          'resolve',
          first,
          callId,
          '--succeeded',
          '{"moved":500}',
          '--by',
          'ops',
          '--redis',
          cluster.url,
        ],
        { prefix, redis: 'none' },
      );
      expect(resolved.code, resolved.err).toBe(0);
      expect((await runtime.ledger(first))[0]).toMatchObject({
        state: 'SUCCEEDED',
        resolution: { by: 'ops', as: 'succeeded' },
      });

      const waitsBefore = await waitsServed();
      const worker = startFlujo(
        ['worker', JOB, '--redis', cluster.url, '--replicas', '1', '--concurrency', '4'],
        { prefix, redis: 'none', env },
      );
      try {
        // `check` fails on each run's first attempt; resumed, the runs finish on the worker.
        const failed = await Promise.all(
          runIds.map(async (id) => (await runtime.attach(id)).settled({ timeoutMs: 30_000 })),
        );
        expect(failed.map((r) => r.status)).toEqual(runIds.map(() => 'failed'));
        for (const id of runIds) await runtime.resume(id, { by: 'ops' });
        const done = await Promise.all(
          runIds.map(async (id) => (await runtime.attach(id)).settled({ timeoutMs: 30_000 })),
        );
        expect(done.map((r) => r.status)).toEqual(runIds.map(() => 'succeeded'));
        expect(done[0]!.summary.produced).toMatchObject({ pay: { paid: { moved: 500 } } });
      } finally {
        worker.child.kill('SIGTERM');
      }
      // The worker waited for a replica after its writes (the API's runtime here did not).
      expect((await waitsServed()) - waitsBefore).toBeGreaterThanOrEqual(runIds.length * 2);
      const stopped = await worker.done;
      expect(stopped.code, stopped.err).toBe(0);
      // One effect per run but the first, whose payment a person recorded.
      expect(readFileSync(effects, 'utf8').trim().split('\n')).toEqual(['500', '500', '500']);
    } finally {
      await runtime.close();
    }
  });

  it('a cluster URL that does not parse is bad input (exit 2), naming the form', async () => {
    const r = await runFlujo(['list', '--redis', 'redis+cluster://127.0.0.1:1,:x'], {
      redis: 'none',
    });
    expect(r.code).toBe(2);
    expect(r.err).toContain('redis+cluster://');
  });

  it('a cluster none of whose seeds answers is unreachable (exit 6), naming the seeds', async () => {
    const r = await runFlujo(['list', '--redis', 'redis+cluster://127.0.0.1:1,127.0.0.1:2'], {
      redis: 'none',
    });
    expect(r.code).toBe(6);
    expect(r.err).toContain(
      'cannot reach Redis at redis+cluster://127.0.0.1:1,127.0.0.1:2: Failed to refresh slots cache',
    );
  });
});
