/**
 * The `flujo` binary (built into dist first) against a Redis Cluster given as a cluster URL: run,
 * status, list, ledger and resume answer for runs whatever master holds them.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runFlujo } from '../helpers/cli.js';
import { startRedisCluster, type TestRedisCluster } from '../helpers/redis-cluster.js';
import { testPrefix } from '../helpers/redis.js';

const JOB = 'test/fixtures/jobs/cluster-ledger.ts';

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
